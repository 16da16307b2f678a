"""The locality-aware policies' incremental state decides as a fresh look would.

A waiting request's cached prefix is checked against the wanted blocks evicted since
its last check (core/prefix_cache.py), and a client's queue keeps its order between
changes (policies/locality.py). Each is compared here with the plain way: walking the
request again from its first block, and sorting the queue at every look.
"""

from __future__ import annotations

import random

import pytest

from tokenfair.core.kv.prefix_index import PrefixIndex
from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.policies import make_policy
from tokenfair.core.policies.locality import LongestPrefixQueue
from tokenfair.core.prefix_cache import CachedPrefixIndex
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.workloads.suites import generate_suite

from .test_locality import grouped, warm


def run(policy: str, requests: int = 160) -> list[tuple]:
    """Each request's admission, first token and finish on `system-prompt` (seed 1) with
    a pool too small for both busy clients' prompts."""
    trace = generate_suite("system-prompt", 1).records[:requests]
    config = SchedulerConfig(
        kv_tokens=3072, enable_prefix_caching=True, share_memory=False, step_share_tokens=None
    )
    result = simulate(trace, make_policy(policy), load_profile("a10g-llama-7b"), config)
    return sorted(
        (r.request_id, r.scheduled_s, r.first_token_s, r.finish_s) for r in result.results
    )


@pytest.mark.parametrize("policy", ["vtc-lpm", "dlpm", "vtc-hit"])
def test_checking_only_the_evicted_blocks_decides_as_walking_again(policy, monkeypatch):
    named = PrefixIndex.wanted_evicted_since
    used = []

    def counting(self, count):
        evicted = named(self, count)
        used.append(evicted is not None)
        return evicted

    monkeypatch.setattr(PrefixIndex, "wanted_evicted_since", counting)
    incremental = run(policy)
    assert sum(used) > 100  # the workload evicts what waiting requests want
    # The plain way: the cache does not name the evicted blocks (as vLLM's does not).
    monkeypatch.setattr(PrefixIndex, "wanted_evicted_since", lambda self, count: None)
    assert run(policy) == incremental


def test_the_index_finds_the_first_evicted_block_of_a_match():
    kv = KVCacheManager(num_blocks=12, block_size=4, enable_prefix_caching=True)
    index = CachedPrefixIndex(lambda r: None)
    index.attach(kv)
    warm(kv, "g", 32)  # eight blocks
    waiting = grouped("a", 40, "g", 32)
    index.track(waiting)
    assert index.blocks(waiting) == 8
    # Two more requests take the pool: the unwanted blocks go first, then the group's
    # last ones (the LRU evicts a request's last blocks first).
    kv.allocate(grouped("b", 24, None), 24)
    kv.allocate(grouped("c", 8, None), 8)
    evicted = kv.wanted_evicted_since(0)
    assert evicted and len(evicted) == kv.wanted_evictions
    assert not index.verify(waiting)
    assert index.blocks(waiting) == kv.cached_prefix_blocks(waiting) < 8
    assert index.verify(waiting)  # nothing evicted since
    index.untrack(waiting)
    kv.check_invariants()


def test_a_queue_iterates_in_the_order_a_fresh_sort_gives():
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=True)
    queues: dict[str, LongestPrefixQueue] = {}
    index = CachedPrefixIndex(lambda r: queues["a"].refresh(r))
    index.attach(kv)
    seq = iter(range(10**6))
    queue = queues["a"] = LongestPrefixQueue(index, seq)
    rng = random.Random(3)
    waiting = []
    for step in range(300):
        action = rng.random()
        if action < 0.4 or not waiting:
            request = grouped("a", 24, f"g{rng.randrange(4)}", 16, priority=rng.randrange(2))
            (queue.requeue if rng.random() < 0.2 else queue.add)(request)
            waiting.append(request)
        elif action < 0.6:
            queue.remove(waiting.pop(rng.randrange(len(waiting))))
        elif action < 0.75:
            waiting.remove(queue.pop())
        else:
            warm(kv, f"g{rng.randrange(4)}", 16)  # prefixes grow: entries filed again
        fresh = [e[5] for e in sorted(e for e in queue._heap if queue._is_live(e))]
        assert list(queue) == fresh, step
