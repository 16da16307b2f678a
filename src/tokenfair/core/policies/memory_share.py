"""A tenant's share of the KV pool: whose memory goes to a blocked tenant, and who is
pushed out when the running requests outgrow the pool.

VTC orders admissions by tokens charged; what an admitted tenant *holds* is another
matter. A tenant flooding long prompts fills the pool with them, and a light tenant far
under its share then waits for a long request to finish before its own short one fits
(docs/fairness.md, "What a tenant holds"). Two rules share the pool by weight among
the tenants holding blocks (and the blocked head's tenant), where a tenant's share is
`pool x weight / the weights' sum`:

- admission (`memory_share_victim`): when the head of the queue does not fit, and its
  tenant stays within its share with the head's blocks, the newest request of the
  tenant furthest over its share (per unit of weight, and strictly over it) gives its
  memory up (recompute: with prefix caching its blocks stay cached, so taking it back
  later costs only what was evicted meanwhile). A tenant alone may fill the whole pool:
  nobody is over a share until someone else asks. The head's tenant is within its
  share after the move, so the two never trade the same memory back and forth.
- running short (`holding_victim_key`): the victim is the newest request of the tenant
  holding the most per unit of weight, so never a tenant under its share while another
  is over it; then the policy's own order (the counter).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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

    def share(self, tenant: str, weight_of: WeightOf) -> float:
        """The tenant's share of the pool, in blocks, among the tenants running and
        the head's."""
        tenants = {request.client for request in self.running} | {self.head.client}
        return self.pool_blocks * weight_of(tenant) / sum(weight_of(t) for t in tenants)

    def held(self, tenant: str) -> int:
        return self.holdings.get(tenant, 0)


def over_memory_share(ask: MemoryAsk, weight_of: WeightOf) -> bool:
    """Whether the head's tenant would hold more than its share with the head."""
    tenant = ask.head.client
    return ask.held(tenant) + ask.need_blocks > ask.share(tenant, weight_of)


def memory_share_victim(ask: MemoryAsk, weight_of: WeightOf) -> RequestView | None:
    """The newest request of the tenant most over its weighted share of the pool, when
    the head keeps its tenant within its share; else None."""
    if over_memory_share(ask, weight_of):
        return None  # the head's tenant would go over its share: it waits its turn
    head = ask.head.client
    over = {
        request.client
        for request in ask.running
        if request.client != head
        and ask.held(request.client) > ask.share(request.client, weight_of)
    }
    if not over:
        return None
    furthest = max(over, key=lambda tenant: ask.held(tenant) / weight_of(tenant))
    return max(
        (request for request in ask.running if request.client == furthest),
        key=lambda request: request.admit_seq,
    )


def holding_victim_key(
    request: RequestView, holdings: Mapping[str, int], weight_of: WeightOf
) -> float:
    """The first part of the memory victim's order: what the request's tenant holds per
    unit of weight (the largest goes first)."""
    return holdings.get(request.client, 0) / weight_of(request.client)
