"""First come, first served: arrival order, the default of most engines."""

from __future__ import annotations

from tokenfair.core.policies.base import KeyedPolicy
from tokenfair.core.policies.declaration import Declared, Needs
from tokenfair.core.policies.view import RequestView


class FCFSPolicy(KeyedPolicy):
    name = "fcfs"

    def sort_key(self, request: RequestView, band: int) -> tuple:
        return (band, request.arrival_s)


DECLARED = [
    Declared(
        "fcfs",
        "first come, first served (arrival order)",
        lambda settings, arg: FCFSPolicy(),
        needs=Needs(per_replica=True),
    )
]
