"""Requests that have arrived but whose handler has not started: the loop's first duty."""

from __future__ import annotations


class Intake:
    """How many requests have arrived (headers parsed) whose handler has not started.

    The server's lower-priority loop work (the middle tokens of a step, waking accepted
    requests) waits while this is above zero, so a new request is taken in first.
    """

    __slots__ = ("arrived",)

    def __init__(self) -> None:
        self.arrived = 0

    def pending(self) -> bool:
        return self.arrived > 0
