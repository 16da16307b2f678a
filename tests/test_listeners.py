"""The uvicorn server of `tokenfair serve` and `tokenfair gateway` sets its start-up heap
aside from the garbage collector and collects young objects less often."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import uvicorn

from tokenfair.commands.listeners import YOUNG_COLLECTION_EVERY, Server, bind


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})


def test_the_start_up_heap_is_frozen_and_young_collections_are_rarer() -> None:
    threshold = gc.get_threshold()
    sockets = bind(_app, "127.0.0.1", 0, None, None)
    server = Server(uvicorn.Config(_app, lifespan="on", log_level="warning"))

    async def start_and_stop() -> int:
        server.config.load()
        server.lifespan = server.config.lifespan_class(server.config)
        await server.lifespan.startup()
        await server.startup(sockets=sockets)
        frozen = gc.get_freeze_count()
        await server.shutdown(sockets=sockets)
        return frozen

    before = gc.get_freeze_count()
    try:
        assert asyncio.run(start_and_stop()) > before + 1000  # modules, classes: all alive
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_EVERY
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        for sock in sockets:
            sock.close()
