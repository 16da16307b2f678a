"""Seam 1: priority bands, strict between them.

A tenant's `band` (tenants file; 0 by default, lower first) puts its requests in that
band. For each model, a lower band's request is offered to the fairness seam only when
no higher band has a request waiting for that model: its capacity goes to the higher
band first, even when the higher band's head does not fit yet (strict, as llm-d's
bands are). Capacity for another model is not held up. Inside a band, each tenant
offers its first request (by the order seam) among the models that have room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tokenfair.gateway.flow.order import TicketQueue
from tokenfair.gateway.flow.ticket import Ticket

HasRoom = Callable[[str, int, int], bool]  # (model, tokens, seats)


class BandedQueues:
    """band -> tenant -> model -> that tenant's queue for that model."""

    def __init__(self) -> None:
        self._bands: dict[int, dict[str, dict[str, TicketQueue]]] = {}
        self._order: list[int] = []  # the bands with waiting requests, highest first

    def add(self, ticket: Ticket) -> None:
        band = self._bands.get(ticket.band)
        if band is None:
            band = self._bands[ticket.band] = {}
            self._order = sorted(self._bands)
        models = band.setdefault(ticket.tenant, {})
        queue = models.get(ticket.model)
        if queue is None:
            queue = models[ticket.model] = TicketQueue()
        queue.push(ticket)

    def remove(self, ticket: Ticket) -> bool:
        """Take a waiting ticket out (the head or any); False if it was not here."""
        models = self._bands.get(ticket.band, {}).get(ticket.tenant)
        queue = models.get(ticket.model) if models is not None else None
        if queue is None or not queue.remove(ticket):
            return False
        self._prune(ticket)
        return True

    def _prune(self, ticket: Ticket) -> None:
        band = self._bands[ticket.band]
        models = band[ticket.tenant]
        if not models[ticket.model]:
            del models[ticket.model]
            if not models:
                del band[ticket.tenant]
                if not band:
                    del self._bands[ticket.band]
                    self._order = sorted(self._bands)

    def waiting(self) -> Iterator[tuple[int, str, str, TicketQueue]]:
        """(band, tenant, model, its queue) of every non-empty queue."""
        for band, tenants in self._bands.items():
            for tenant, models in tenants.items():
                for model, queue in models.items():
                    yield band, tenant, model, queue

    def candidates(self, has_room: HasRoom) -> tuple[int, list[Ticket]] | None:
        """The highest band with a request that may go now, and each of its tenants'
        first such request (oldest first), or None."""
        blocked: set[str] = set()
        for band in self._order:
            heads: list[Ticket] = []
            here: set[str] = set()
            for models in self._bands[band].values():
                best: Ticket | None = None
                for model, queue in models.items():
                    here.add(model)
                    if model in blocked:
                        continue
                    head = queue.head()
                    if (best is None or head.key < best.key) and has_room(
                        model, head.tokens, head.seats
                    ):
                        best = head
                if best is not None:
                    heads.append(best)
            if heads:
                heads.sort(key=lambda t: t.seq)  # ties in the fairness seam: the oldest
                return band, heads
            blocked |= here
        return None
