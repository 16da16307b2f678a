"""Clocks the engine can run on: the wall clock for serving, a virtual one to simulate."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def advance(self, seconds: float) -> None:
        """A step of `seconds` has been executed."""
        ...


class WallClock:
    """Monotonic seconds since the clock was made; steps take real time, so advance is a no-op."""

    def __init__(self) -> None:
        self._origin = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._origin

    def advance(self, seconds: float) -> None:
        pass


class VirtualClock:
    """Simulated seconds: time moves only when a step's modelled duration is added."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time cannot go backwards")
        self._now += seconds

    def jump_to(self, t: float) -> None:
        """Skip idle time up to `t` (never backwards)."""
        self._now = max(self._now, t)
