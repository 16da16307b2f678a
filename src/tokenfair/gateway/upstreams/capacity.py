"""What sharing an upstream's capacity between gateway replicas is about (leases.py):
a replica's lease on an upstream, and what its waiting requests need."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Claim = tuple[int, float]  # (band, counter) of a waiting request: the lower goes first


@dataclass(slots=True)
class Lease:
    """This replica's part of an upstream's capacity."""

    slots: int = 0  # sequences it may have running there at once (one per choice)
    tokens: int = 0  # in-flight tokens it may hold there
    giving_back: bool = False  # it holds more than its due: what frees returns, down to it
    keep_slots: int = 0  # its due, at the last sync
    keep_tokens: int = 0
    others_slots: int = 0  # held by the other live replicas, at the last sync
    others_tokens: int = 0
    on_give_back: Callable[[], None] | None = None  # capacity went back: tell the pool

    def view(self) -> dict[str, int | bool]:
        """As /v1/gateway/state shows it."""
        return {
            "slots": self.slots,
            "tokens": self.tokens,
            "giving_back": self.giving_back,
            "others_slots": self.others_slots,
            "others_tokens": self.others_tokens,
        }


@dataclass(slots=True)
class ModelDemand:
    """This replica's waiting requests for one model."""

    seats: int = 0  # the upstream sequences they would run (one per choice)
    tokens: int = 0  # the in-flight tokens they would hold
    claim: Claim | None = None  # the best of them
    # The top-level nodes (tenants, or groups as `@path`) waiting, with their weights.
    nodes: dict[str, float] = field(default_factory=dict)
