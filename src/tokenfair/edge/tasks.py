"""Stopping background tasks at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object] | None]) -> None:
    """Cancel every task (None: none started), then wait until each has ended, so no
    loop still runs when the caller goes on to close what the tasks use."""
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    for task in started:
        with contextlib.suppress(asyncio.CancelledError):
            await task
