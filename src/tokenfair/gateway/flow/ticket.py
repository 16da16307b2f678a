"""One request's passage through the gateway's queue, from arrival to release: its
states and the moves between them, written once (`TicketState`, `MOVES`); admission.py
makes every move through `Ticket.move`, which refuses any other."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenfair.core.policies.ledger import Charge
from tokenfair.core.policies.view import PolicyRequest
from tokenfair.gateway.upstreams.prefix import PrefixKey

if TYPE_CHECKING:
    from tokenfair.gateway.upstreams.pool import Upstream


class TicketState(enum.Enum):
    NEW = "new"  # built: not yet queued nor dispatched
    WAITING = "waiting"  # in its tenant's queue
    PICKING = "picking"  # a head the fairness seam is choosing among
    ABANDONED = "abandoned"  # its client left during a pick: the dispatcher drops it
    RETRYING = "retrying"  # waiting for an upstream again, ahead of the queues
    DISPATCHED = "dispatched"  # holds a slot (and its tokens) of an upstream
    RELEASED = "released"  # over, or gone before dispatch: it holds nothing


S = TicketState
MOVES: dict[TicketState, frozenset[TicketState]] = {
    S.NEW: frozenset({S.WAITING, S.DISPATCHED}),  # queued, or straight to an upstream
    S.WAITING: frozenset({S.PICKING, S.RELEASED}),  # a head of a pick, or its client left
    # Picked (to an upstream, or to wait for one again), not picked, or left meanwhile.
    S.PICKING: frozenset({S.DISPATCHED, S.RETRYING, S.WAITING, S.ABANDONED}),
    S.ABANDONED: frozenset({S.RELEASED}),
    S.RETRYING: frozenset({S.DISPATCHED, S.RELEASED}),
    S.DISPATCHED: frozenset({S.RELEASED}),
    S.RELEASED: frozenset({S.RETRYING}),  # its upstream failed before the first byte
}


class TicketMoveError(RuntimeError):
    """A move `MOVES` does not have: a bug in the admission loop."""


@dataclass(eq=False, slots=True)
class Ticket:
    tenant: str
    model: str
    tokens: int  # in-flight tokens it holds: prompt + max_tokens
    charge: Charge  # charged at dispatch: (node, weighted amount) down the tenant's path
    seats: int = 1  # sequences it runs upstream at once: one per choice (`n`, prompts)
    priority: int = 0
    max_tokens: int = 256
    band: int = 0
    seq: int = 0
    arrival: float = 0.0
    key: tuple = ()  # its place in its tenant's queue (order.py)
    dispatches_at_arrival: int = 0  # the gateway's dispatch count when this one arrived
    exclude: frozenset[str] = frozenset()
    prefix: PrefixKey | None = None  # what the router places it by
    future: asyncio.Future[Upstream] | None = None
    upstream: Upstream | None = None
    view: PolicyRequest | None = None  # what the core's ordering policies see of it
    state: TicketState = TicketState.NEW  # moved by `move` alone
    recorded: bool = False  # its queueing is in `Admission.recent` (a retry waits no turn)

    def move(self, to: TicketState) -> None:
        if to not in MOVES[self.state]:
            raise TicketMoveError(f"a ticket cannot go from {self.state.value} to {to.value}")
        self.state = to
