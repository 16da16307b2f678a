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

from tokenfair.core.policies.view import RequestView


def memory_shares(
    head: RequestView, running: Sequence[RequestView], weight_of: Callable[[str], float]
) -> Callable[[str], float]:
    """Each tenant's share of the pool (as a fraction) among the tenants running and
    the head's."""
    tenants = {request.client for request in running} | {head.client}
    total_weight = sum(weight_of(tenant) for tenant in tenants)
    return lambda tenant: weight_of(tenant) / total_weight


def over_memory_share(
    head: RequestView,
    need_blocks: int,
    running: Sequence[RequestView],
    holdings: Mapping[str, int],
    pool_blocks: int,
    weight_of: Callable[[str], float],
) -> bool:
    """Whether `head`'s tenant would hold more than its share with `need_blocks` more."""
    share = memory_shares(head, running, weight_of)
    return holdings.get(head.client, 0) + need_blocks > pool_blocks * share(head.client)


def memory_share_victim(
    head: RequestView,
    need_blocks: int,
    running: Sequence[RequestView],
    holdings: Mapping[str, int],
    pool_blocks: int,
    weight_of: Callable[[str], float],
) -> RequestView | None:
    """The newest request of the tenant most over its weighted share of the pool, when
    `head` (needing `need_blocks` more) keeps its tenant within its share; else None."""
    if over_memory_share(head, need_blocks, running, holdings, pool_blocks, weight_of):
        return None  # the head's tenant would go over its share: it waits its turn
    share = memory_shares(head, running, weight_of)
    over = {
        request.client
        for request in running
        if request.client != head.client
        and holdings.get(request.client, 0) > pool_blocks * share(request.client)
    }
    if not over:
        return None
    furthest = max(over, key=lambda tenant: holdings.get(tenant, 0) / weight_of(tenant))
    return max(
        (request for request in running if request.client == furthest),
        key=lambda request: request.admit_seq,
    )


def holding_victim_key(
    request: RequestView, holdings: Mapping[str, int], weight_of: Callable[[str], float]
) -> float:
    """The first part of the memory victim's order: what the request's tenant holds per
    unit of weight (the largest goes first)."""
    return holdings.get(request.client, 0) / weight_of(request.client)
