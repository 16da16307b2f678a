"""First come, first served: arrival order, the default of most engines."""

from __future__ import annotations

from tokenfair.core.policies.base import KeyedPolicy
from tokenfair.core.request import Request


class FCFSPolicy(KeyedPolicy):
    name = "fcfs"

    def sort_key(self, request: Request, band: int) -> tuple:
        return (band, request.arrival_s)
