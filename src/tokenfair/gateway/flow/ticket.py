"""One request's passage through the gateway's queue, from arrival to release."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenfair.core.policies.ledger import Charge
from tokenfair.core.policies.view import PolicyRequest
from tokenfair.gateway.upstreams.prefix import PrefixKey

if TYPE_CHECKING:
    from tokenfair.gateway.upstreams.pool import Upstream


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
    state: str = "new"  # new -> waiting -> picking -> dispatched -> released
    released: bool = field(default=False)
    recorded: bool = False  # its queueing is in `Admission.recent` (a retry waits no turn)
