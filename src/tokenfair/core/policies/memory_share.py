"""A tenant's share of the KV pool: whose memory goes to a blocked tenant, who lets
whom pass, and who is pushed out when the running requests outgrow the pool.

VTC orders admissions by tokens charged; what an admitted tenant *holds* is another
matter. Tenants flooding long prompts fill the pool with them, and a light tenant far
under its share then waits for a long request to finish before its own short one fits
(docs/fairness.md, "One rule for what a tenant holds").

Two shares of the pool, by weight, with one role each, as an operating system gives a
process a guaranteed floor and shares what is spare:

- a tenant's *entitlement*, `pool x weight / the weights' sum` over the tenants holding
  memory and the blocked head's: what it may hold whatever the others ask. Taking
  memory from a running request costs its recompute, so memory is taken only from a
  tenant over its entitlement, and only for a tenant within its own.
- a tenant's *fair share* (`MemoryAsk.fair_level`): its weighted max-min share of what
  the tenants ask (each asks what it holds; a tenant whose head waits, that and the
  head's blocks): a tenant asking less than its part keeps what it asks, and what it
  leaves is split among the others (water-filling). Memory that frees goes first to
  the tenants within it.

A tenant alone may fill the whole pool: nobody is over a share until someone else asks.

The rules:
- taking (`memory_share_victim`): when the head of the queue does not fit and its
  tenant stays within its entitlement with the head's blocks, the newest request of
  the tenant furthest over its entitlement (per unit of weight) gives its memory up
  (recompute: with prefix caching its blocks stay cached, so taking it back later
  costs only what was evicted meanwhile), if the giver still holds as much per unit of
  weight as the head's tenant after the move: the two never change places, so the
  same memory is never traded back and forth.
- waiting (`over_memory_share`): a head that cannot start, whatever its tenant holds,
  does not stop the tenants within their fair share: the next tenant's request may
  start before it if its tenant stays within its fair share counting what every
  waiting head asks. Those passers take no memory the waiting heads are owed (the
  shares sum to the pool), so a head within its share still gets its memory as the
  tenants over theirs give it up or finish; a head over its share waits for its own
  tenant's requests to finish, as any tenant over its share does.
- running short (`holding_victim_key`): the victim is the newest request of the tenant
  holding the most per unit of weight, so never a tenant under its share while another
  is over it; then the policy's own order (the counter).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tokenfair.core.policies.view import RequestView

WeightOf = Callable[[str], float]


@dataclass(frozen=True, slots=True)
class MemoryAsk:
    """A head of the queue short of KV memory, and what the tenants hold: what the
    memory hooks of a policy are asked about."""

    head: RequestView
    need_blocks: int  # what its whole prompt adds to what its tenant holds
    running: Sequence[RequestView]  # who may give memory (not admitted in this step)
    holdings: Mapping[str, int]  # tenant -> KV blocks held
    pool_blocks: int
    block_size: int  # tokens per block
    # Heads of the queue that stepped aside in this step: tenant -> the blocks its head
    # adds (set when the head is a request behind them, asking whether it may pass).
    waiting: Mapping[str, int] = field(default_factory=dict)

    def blocks_of(self, request: RequestView) -> int:
        """The blocks a running request holds, at most (a prefix it shares with its
        tenant's other requests frees none)."""
        return -(-(request.input_tokens + request.num_output_tokens) // self.block_size)

    def held(self, tenant: str) -> int:
        return self.holdings.get(tenant, 0)

    def wants(self) -> dict[str, int]:
        """What each tenant asks of the pool: what it holds; the head's tenant and the
        tenants whose heads stepped aside, that and their head's blocks."""
        wants = {request.client: self.held(request.client) for request in self.running}
        for tenant, need in self.waiting.items():
            wants[tenant] = self.held(tenant) + need
        wants[self.head.client] = self.held(self.head.client) + self.need_blocks
        return wants

    def fair_level(self, weight_of: WeightOf) -> float:
        """The max-min fair share of the pool per unit of weight: a tenant's share is
        this times its weight (infinite when every tenant's ask fits)."""
        wants = self.wants()
        if sum(wants.values()) <= self.pool_blocks:
            return math.inf
        left, weight_left = float(self.pool_blocks), sum(weight_of(t) for t in wants)
        for tenant in sorted(wants, key=lambda t: wants[t] / weight_of(t)):
            weight = weight_of(tenant)
            if wants[tenant] > left * weight / weight_left:
                return left / weight_left  # this tenant and the rest are capped
            left -= wants[tenant]
            weight_left -= weight
        return math.inf

    def entitlement_level(self, weight_of: WeightOf) -> float:
        """The pool per unit of weight among the tenants running and the head's: a
        tenant's entitlement is this times its weight."""
        tenants = dict.fromkeys([*(request.client for request in self.running), self.head.client])
        return self.pool_blocks / sum(weight_of(t) for t in tenants)


def over_memory_share(ask: MemoryAsk, weight_of: WeightOf) -> bool:
    """Whether the request asked about, short of memory, lets the next tenant's request
    try instead (core/contention.py, `gives_way`).

    A head first in line always does: whether its tenant is within its share (it waits
    for its memory to be given up or freed) or over it (it waits for its own requests
    to finish), a tenant within its share must not wait behind it. Letting only the
    tenant asking the most step aside kept every light tenant behind the second and
    third long-prompt tenants (docs/fairness.md). A request behind heads that stepped
    aside (`ask.waiting`) may start before them only if its tenant stays within its
    fair share counting what those heads ask: it then takes no memory they are owed.
    """
    if not ask.waiting:
        return True
    tenant = ask.head.client
    return ask.wants()[tenant] > ask.fair_level(weight_of) * weight_of(tenant)


def memory_share_victim(ask: MemoryAsk, weight_of: WeightOf) -> RequestView | None:
    """The newest request of the tenant most over its entitlement to the pool, when the
    head keeps its tenant within its own; else None."""
    head = ask.head.client
    level = ask.entitlement_level(weight_of)
    if ask.held(head) + ask.need_blocks > level * weight_of(head):
        return None  # the head's tenant would go over its share: it waits its turn
    # In the order the tenants run (a list, not a set): a tie between two tenants holding
    # alike goes the same way in every process, whatever the string hashes.
    over = [
        tenant
        for tenant in dict.fromkeys(request.client for request in ask.running)
        if tenant != head and ask.held(tenant) > level * weight_of(tenant)
    ]
    if not over:
        return None
    furthest = max(over, key=lambda tenant: ask.held(tenant) / weight_of(tenant))
    victim = max(
        (request for request in ask.running if request.client == furthest),
        key=lambda request: request.admit_seq,
    )
    # A move that would leave the giver holding less per unit of weight than the head's
    # tenant then holds only swaps who is short: two tenants asking alike would take the
    # same memory back and forth, recomputing a request each time.
    left = (ask.held(furthest) - ask.blocks_of(victim)) / weight_of(furthest)
    if left < (ask.held(head) + ask.need_blocks) / weight_of(head):
        return None
    return victim


def holding_victim_key(
    request: RequestView, holdings: Mapping[str, int], weight_of: WeightOf
) -> float:
    """The first part of the memory victim's order: what the request's tenant holds per
    unit of weight (the largest goes first)."""
    return holdings.get(request.client, 0) / weight_of(request.client)
