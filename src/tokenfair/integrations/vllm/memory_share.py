"""Admission against what each tenant holds, inside vLLM's loop.

vLLM's `schedule()` takes the waiting queue's head, asks its KV cache manager for the
blocks, and stops admitting at the first request that does not fit. The plugin owns
the queue's order, not that decision, so it shares memory the way the engine's
scheduler does at admission (core/holding_share.py) by ordering: before each step,
when the policy's head does not fit in the free blocks and its tenant is the one
filling the pool (`Policy.over_memory_share`), that tenant's requests go after the
other tenants' for this step, and so do those of any tenant over its max-min share of
the pool counting what the head asks (policies/memory_share.py). vLLM then tries a
request of a tenant within its share first; if that does not fit either, it stops as
it would have.

What vLLM knows and the plugin does not, before it tries: how much of a waiting
request's prompt its prefix cache holds. A request's need is counted as its whole
prompt (and any output a preempted request recomputes), so a tenant with cached
prefixes may step aside when it would have fitted; its request then starts in a later
step. What the plugin cannot do inside vLLM: take memory from a running request for a
waiting one (vLLM preempts only when the running requests outgrow the pool), or cap
one tenant's prefill chunks in a step (vLLM fills the step's token budget in the
running queue's order) (docs/vllm.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenfair.core.policies.memory_share import MemoryAsk
from tokenfair.core.policies.view import RequestView
from tokenfair.integrations.vllm.driver import PolicyDriver


def blocks_asked(request: RequestView, block_size: int) -> int:
    """The blocks a waiting request takes when it starts, with nothing cached."""
    return -(-(request.input_tokens + request.num_output_tokens) // block_size)


def tenants_aside(
    driver: PolicyDriver,
    running: Sequence[Any],
    holdings: Mapping[str, int] | Callable[[], Mapping[str, int]],
    free_blocks: int,
    pool_blocks: int,
    block_size: int,
) -> frozenset[str]:
    """The tenants whose waiting requests go after the others' in this step (none when
    the head fits): the head's, when its tenant fills the pool, and every tenant over
    its max-min share counting what that head asks. `running`: vLLM's running
    requests; `holdings`: the blocks each tenant holds, or how to read them (only
    when the head does not fit: the common step reads nothing)."""
    policy = driver.policy
    head = policy.peek()
    if head is None:
        return frozenset()
    need = blocks_asked(head, block_size)
    if need <= free_blocks:
        return frozenset()
    if callable(holdings):
        holdings = holdings()
    views = [driver.view(request.request_id) for request in running]
    if not policy.over_memory_share(
        MemoryAsk(head, need, views, holdings, pool_blocks, block_size)
    ):
        return frozenset()
    asked = {head.client: need}
    aside = {head.client}
    seen = {head.client}
    for waiting in policy.waiting_requests():
        if waiting.client in seen:
            continue  # a tenant's first waiting request speaks for it
        seen.add(waiting.client)
        ask = MemoryAsk(
            waiting,
            blocks_asked(waiting, block_size),
            views,
            holdings,
            pool_blocks,
            block_size,
            asked,
        )
        if policy.over_memory_share(ask):
            aside.add(waiting.client)
    return frozenset(aside)
