"""Per-request priority: lower value runs first (vLLM's convention), ties by arrival.

Under memory pressure the victim is the lowest-priority running request (largest value),
the newest among equals.
"""

from __future__ import annotations

from collections.abc import Sequence

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

    def preempt_for(self, head: RequestView, running: Sequence[RequestView]) -> RequestView | None:
        # A strictly more important request may push out the least important one.
        if not running:
            return None
        worst = self.victim(running)
        return worst if worst.priority > head.priority else None


DECLARED = [
    Declared(
        "priority",
        "per-request priority, lower value first; preempts the lowest priority",
        lambda settings, arg: PriorityPolicy(),
        needs=Needs(per_replica=True),
    )
]
