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
    on_give_back: Callable[[], None] | None = None  # capacity went back: tell Redis

    # --- every change of a lease is one of these ---
    def give_back(self, running: int, inflight: int) -> bool:
        """Requests ended (`running` and `inflight` are what still runs): while holding
        more than its due, the lease goes down to the larger of the two; True if it
        did (Redis is to hear of it: `on_give_back`)."""
        if not self.giving_back:
            return False
        slots = min(self.slots, max(running, self.keep_slots))
        tokens = min(self.tokens, max(inflight, self.keep_tokens))
        if slots == self.slots and tokens == self.tokens:
            return False
        self.slots, self.tokens = slots, tokens
        if self.on_give_back is not None:
            self.on_give_back()
        return True

    def settle(
        self,
        held: tuple[int, int],
        others: tuple[int, int],
        due: tuple[int, int],
        running: int,
        inflight: int,
    ) -> bool:
        """A sync's answer: the (slots, tokens) this replica holds, the others hold and
        it is due. Holding more than its due, it starts nothing new beyond it, and what
        does not run goes back now (what runs, as it ends: `give_back`). True if the
        lease grew."""
        grew = held[0] > self.slots or held[1] > self.tokens
        self.slots, self.tokens = held
        self.others_slots, self.others_tokens = others
        self.keep_slots, self.keep_tokens = due
        self.giving_back = self.slots > self.keep_slots or self.tokens > self.keep_tokens
        self.give_back(running, inflight)
        return grew

    def grant(self, slots: int | None, tokens: int | None) -> bool:
        """Another replica's sync granted this one a lease in Redis (its announcement).
        A grant is at most the due (lease_script.py): the due is at least that now, or
        what was granted would go back as soon as it frees. True if the lease grew."""
        grew = False
        if slots is not None and slots > self.slots:
            self.slots, self.keep_slots, grew = slots, max(self.keep_slots, slots), True
        if tokens is not None and tokens > self.tokens:
            self.tokens, self.keep_tokens, grew = tokens, max(self.keep_tokens, tokens), True
        self.giving_back = self.slots > self.keep_slots or self.tokens > self.keep_tokens
        return grew

    def stop_giving_back(self) -> None:
        """Without Redis, for a blip (lease_outage.py): the lease as it is, kept."""
        self.giving_back = False

    def hold(self, slots: int, tokens: int) -> bool:
        """Without Redis (lease_outage.py): exactly this, giving nothing back. True if
        it grew."""
        grew = slots > self.slots or tokens > self.tokens
        self.slots, self.tokens, self.giving_back = slots, tokens, False
        return grew

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
