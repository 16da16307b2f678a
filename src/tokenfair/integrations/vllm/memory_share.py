"""Admission against what each tenant holds, inside vLLM's loop.

vLLM's `schedule()` takes the waiting queue's head, asks its KV cache manager for the
blocks, and stops admitting at the first request that does not fit. The plugin owns
the queue's order and what runs before vLLM's pass, so it applies the core's rule for
what a tenant holds (core/policies/memory_share.py: the same `MemoryAsk` and the same
policy hooks, asked the same questions) in one walk before each step, over the first
waiting request of each tenant in the policy's order:

- *taking*: a request that does not fit in the free blocks, with a seat free, gets the
  memory of the newest running request of the tenant furthest over its entitlement,
  if its own tenant stays within its entitlement (`contention.memory_giver`); the
  scheduler preempts that request as vLLM's own preemption does, and the giver's
  waiting requests go after the others' for this step, so it does not take the memory
  straight back.
- *passing*: a request that still does not fit lets the next tenant's try, whatever
  its tenant holds (`contention.gives_way`, asked with no waiting heads), and a
  tenant behind such heads goes first only if it stays within its max-min share of the
  pool counting what every one of those heads asks (asked with them). The tenants that
  may not go first, and those whose heads wait, go after the others for this step;
  vLLM then tries a request of a tenant within its share first, and stops, as always,
  at the first one that does not fit.

What vLLM knows and the plugin does not, before it tries: how much of a waiting
request's prompt its prefix cache holds. A request's need is counted as its whole
prompt (and any output a preempted request recomputes), so a tenant with cached
prefixes may step aside when it would have fitted; its request then starts in a later
step. The walk is made once before vLLM's pass: a tenant that passes may have more
than one request admitted in the step, each checked by vLLM against the free blocks
only (docs/vllm.md, "What a tenant holds").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenfair.core.contention import gives_way, memory_giver
from tokenfair.core.policies.memory_share import MemoryAsk
from tokenfair.core.policies.view import RequestView
from tokenfair.integrations.vllm.driver import PolicyDriver


def blocks_asked(request: RequestView, block_size: int) -> int:
    """The blocks a waiting request takes when it starts, with nothing cached."""
    return -(-(request.input_tokens + request.num_output_tokens) // block_size)


@dataclass(slots=True)
class Pool:
    """What the walk reads of vLLM's KV pool and batch, and how it takes memory."""

    free_blocks: int
    pool_blocks: int
    block_size: int
    free_seats: int
    # The blocks each tenant holds, or how to read them (read only on contention).
    holdings: Mapping[str, int] | Callable[[], Mapping[str, int]]
    # Preempt a running request (by id); returns the pool's free blocks after it.
    preempt: Callable[[str], int] = field(default=lambda _: 0)


def walk_memory(driver: PolicyDriver, running: Sequence[Any], pool: Pool) -> frozenset[str]:
    """Take memory for waiting requests within their entitlement (preempting through
    `pool.preempt`), and return the tenants whose waiting requests go after the
    others' in this step (none when the policy's head fits). `running`: vLLM's running
    requests."""
    policy = driver.policy
    head = policy.peek()
    if head is None or blocks_asked(head, pool.block_size) <= pool.free_blocks:
        return frozenset()
    held = dict(pool.holdings() if callable(pool.holdings) else pool.holdings)
    views: list[RequestView] = [driver.view(request.request_id) for request in running]
    free, seats = pool.free_blocks, pool.free_seats
    aside: set[str] = set()
    asked: dict[str, int] = {}  # the heads waiting for memory: tenant -> blocks asked
    seen: set[str] = set()

    def ask(request: RequestView, need: int, waiting: Mapping[str, int]) -> MemoryAsk:
        return MemoryAsk(
            request, need, views, held, pool.pool_blocks, pool.block_size, dict(waiting)
        )

    for waiting in list(policy.waiting_requests()):
        if seats <= 0:
            break  # nothing more starts in this step
        tenant = waiting.client
        if tenant in seen or tenant in aside:
            continue  # a tenant's first waiting request speaks for it
        seen.add(tenant)
        need = blocks_asked(waiting, pool.block_size)
        if asked and gives_way(policy, ask(waiting, need, asked)):
            aside.add(tenant)  # it would take memory the waiting heads are owed
            continue
        while need > free:
            victim = memory_giver(policy, ask(waiting, need, {}))
            if victim is None:
                break
            views.remove(victim)
            held[victim.client] = max(
                0, held.get(victim.client, 0) - blocks_asked(victim, pool.block_size)
            )
            free = pool.preempt(victim.request_id)
            seats += 1
            aside.add(victim.client)  # it gave way: it does not take it back now
        if need <= free:
            free -= need  # it starts (vLLM decides): the next ones count without it
            seats -= 1
            held[tenant] = held.get(tenant, 0) + need
            continue
        if not gives_way(policy, ask(waiting, need, {})):
            break  # the policy lets a head that does not fit stop admission
        aside.add(tenant)
        asked[tenant] = need
    return frozenset(aside)
