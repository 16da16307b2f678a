"""Per-request priority: lower value runs first (vLLM's convention), ties by arrival.

Under memory pressure the victim is the lowest-priority running request (largest value),
the newest among equals.
"""

from __future__ import annotations

from tokenfair.core.policies.base import KeyedPolicy
from tokenfair.core.policies.declaration import Declared, Needs
from tokenfair.core.policies.view import RequestView


class PriorityPolicy(KeyedPolicy):
    name = "priority"

    def sort_key(self, request: RequestView, band: int) -> tuple:
        # Priority first: a preempted request goes back ahead of its equals only.
        return (request.priority, band, request.arrival_s)

    def victim_key(self, request: RequestView) -> tuple:
        return (request.priority, request.admit_seq)

    def preempts_for(self, head: RequestView, candidate: RequestView) -> bool:
        # A strictly more important request may push out the least important one.
        return candidate.priority > head.priority


DECLARED = [
    Declared(
        "priority",
        "per-request priority, lower value first; preempts the lowest priority",
        lambda settings, arg: PriorityPolicy(),
        needs=Needs(per_replica=True),
    )
]
