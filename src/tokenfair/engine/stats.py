"""What an engine holds and has done, as one object it hands out between two steps
(`Engine.stats`): the server's metrics and admin pages and a trace replay's totals read
this, never the scheduler's, the pool's or the policy's fields."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tokenfair.core.scheduler import Scheduler
from tokenfair.core.share_tree import is_group


def _since(now: dict[str, int], then: dict[str, int]) -> dict[str, int]:
    return {key: n - then.get(key, 0) for key, n in now.items() if n > then.get(key, 0)}


@dataclass(slots=True)
class EngineStats:
    """Requests by tenant and state, the policy's counters and weights, the KV pool, and
    the engine's cumulative counts (steps, busy time, preemptions by cause, swaps)."""

    running: Counter[str] = field(default_factory=Counter)
    waiting: Counter[str] = field(default_factory=Counter)
    swapped: Counter[str] = field(default_factory=Counter)
    counters: dict[str, float] = field(default_factory=dict)
    group_counters: dict[str, float] = field(default_factory=dict)  # group path -> counter
    weights: dict[str, float] = field(default_factory=dict)  # tenants, and groups as @path
    kv_used_blocks: int = 0
    kv_blocks: int = 1
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    num_steps: int = 0
    busy_s: float = 0.0
    preemptions: dict[str, int] = field(default_factory=dict)  # by tenant, every cause
    # Preemptions by cause: the pool was short (a sizing problem), or the policy chose
    # to admit a waiting request (vtc-preempt, priority).
    memory_preemptions: dict[str, int] = field(default_factory=dict)  # by tenant
    num_preemptions: int = 0
    num_memory_preemptions: int = 0
    num_policy_preemptions: int = 0
    num_swaps: int = 0
    # Exceptions raised by a served policy's hooks (0 or 1: engine/policy_guard.py).
    policy_failures: int = 0

    @classmethod
    def of(cls, scheduler: Scheduler, num_steps: int, busy_s: float) -> EngineStats:
        """An engine's, from its scheduler and its own counts (`Engine.stats`)."""
        policy = scheduler.policy
        kv = scheduler.kv
        return cls(
            running=Counter(r.client for r in scheduler.running),
            waiting=Counter(r.client for r in policy.waiting_requests()),
            swapped=Counter(r.client for r in scheduler.swapped),
            counters=policy.counters(),
            group_counters={
                node[1:]: c for node, c in policy.node_counters().items() if is_group(node)
            },
            weights=policy.weights_in_use(),
            kv_used_blocks=kv.num_used_blocks,
            kv_blocks=kv.num_blocks,
            prefix_hit_tokens=kv.prefix_hit_tokens,
            prefix_query_tokens=kv.prefix_query_tokens,
            num_steps=num_steps,
            busy_s=busy_s,
            preemptions=dict(scheduler.preemptions_by_client),
            memory_preemptions=dict(scheduler.memory_preemptions_by_client),
            num_preemptions=scheduler.num_preemptions,
            num_memory_preemptions=scheduler.num_memory_preemptions,
            num_policy_preemptions=scheduler.num_policy_preemptions,
            num_swaps=scheduler.num_swaps,
            policy_failures=getattr(policy, "failures", 0),
        )

    def preemptions_since(self, earlier: EngineStats) -> dict[str, int]:
        """Each tenant's preemptions between `earlier` and these (those with any)."""
        return _since(self.preemptions, earlier.preemptions)

    def memory_preemptions_since(self, earlier: EngineStats) -> dict[str, int]:
        return _since(self.memory_preemptions, earlier.memory_preemptions)
