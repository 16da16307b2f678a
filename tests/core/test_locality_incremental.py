"""The locality-aware policies' incremental state decides as a fresh look would.

Waiting requests are kept in groups: those of one queue, priority and band whose cached
prefix is the same chain of blocks (core/cached_prefix_index.py). A group's prefix is checked
against the wanted blocks evicted since its last check, and moves in its queue as one
entry (policies/locality.py). Each is compared here with the plain way: every request a
group of its own, walked again from its first block; and the queue's order, head and
wanted blocks with a fresh look at the cache.
"""

from __future__ import annotations

import random

import pytest

from tokenfair.core.cached_prefix_index import CachedPrefixIndex
from tokenfair.core.kv.prefix_index import PrefixIndex
from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.policies import make_policy
from tokenfair.core.policies.locality import LongestPrefixQueue
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.workloads.suites import generate_suite

from .test_locality import grouped, warm

POLICIES = ["vtc-lpm", "dlpm", "vtc-hit"]


def run(policy: str, requests: int = 160, suite: str = "system-prompt") -> list[tuple]:
    """Each request's admission, first token and finish on `suite` (seed 1) with a pool
    too small for both busy clients' prompts."""
    trace = generate_suite(suite, 1).records[:requests]
    config = SchedulerConfig(
        kv_tokens=3072, enable_prefix_caching=True, share_memory=False, step_share_tokens=None
    )
    result = simulate(trace, make_policy(policy), load_profile("a10g-llama-7b"), config)
    return sorted(
        (r.request_id, r.scheduled_s, r.first_token_s, r.finish_s) for r in result.results
    )


class _NeverFound(dict):
    """An index's table of groups that finds none: every request a group of its own."""

    def get(self, key, default=None):
        return default


@pytest.mark.parametrize("policy", POLICIES)
def test_grouped_requests_decide_as_each_on_its_own(policy, monkeypatch):
    largest = []
    track = CachedPrefixIndex.track

    def tracking(self, request, *args):
        group = track(self, request, *args)
        largest.append(len(group.members))
        return group

    monkeypatch.setattr(CachedPrefixIndex, "track", tracking)
    grouped_run = run(policy)
    assert max(largest) > 20  # a busy client's requests wait in one group
    largest.clear()
    attach = CachedPrefixIndex.attach

    def alone(self, cache):
        self._groups = _NeverFound()
        attach(self, cache)

    monkeypatch.setattr(CachedPrefixIndex, "attach", alone)
    assert run(policy) == grouped_run
    assert max(largest) == 1


@pytest.mark.parametrize("policy", POLICIES)
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


def check_index(index: CachedPrefixIndex, kv: KVCacheManager, queues) -> None:
    """What the index and the queues hold against a fresh look at the cache."""
    claimed: dict[int, int] = {}  # hash -> groups claiming it
    groups = {}
    queues = [queue for queue in queues if len(queue)]
    heads = [queue.head() for queue in queues]  # checked: claims may shrink
    for queue, head in zip(queues, heads, strict=True):
        assert isinstance(queue, LongestPrefixQueue)
        requests = list(queue)
        assert len(requests) == len(queue)
        for request in requests:
            claim = index.blocks(request)
            # A claim never understates, and covers what the cache holds of it.
            assert claim >= kv.cached_prefix_blocks(request), request.request_id
            group = index.group_of(request)
            assert group is not None and group.owner is queue
            assert request in group.requests()
            hashes = kv.block_hashes(request, kv.matchable_blocks(request))
            assert hashes[:claim] == group.chain[:claim]
            groups[id(group)] = group
        # The head: the first by priority, band, then the longest prefix the cache holds.
        assert queue.head() is head
        assert queue.head_blocks() == kv.cached_prefix_blocks(head)
        # (Its place in line among its equals: the order the queue gave it.)
        first = min(
            requests,
            key=lambda r: (
                r.priority,
                index.group_of(r).band,
                -kv.cached_prefix_blocks(r),
                index._members[r.request_id].order,
            ),
        )
        assert head is first
    # The blocks the cache keeps for waiting requests are exactly those they claim,
    # counted once per group.
    for group in groups.values():
        for key in group.chain[: group.blocks]:
            claimed[key] = claimed.get(key, 0) + 1
    assert kv.index.wanted == claimed


def test_a_queue_follows_the_cache_as_a_fresh_look_would():
    kv = KVCacheManager(num_blocks=24, block_size=4, enable_prefix_caching=True)
    queues: dict[str, LongestPrefixQueue] = {}
    index = CachedPrefixIndex(lambda group: group.owner.refile(group))
    index.attach(kv)
    seq = iter(range(10**6))
    queue = queues["a"] = LongestPrefixQueue(index, seq)
    rng = random.Random(3)
    waiting = []
    fillers = []
    shrank = largest = 0
    for _ in range(600):
        action = rng.random()
        if action < 0.35 or not waiting:
            # Four documents of two lengths; a third of the requests ask without one.
            group = rng.choice(["g0", "g1", "g2", "g3", None])
            prefix = 16 if group in ("g0", "g1") else 28
            request = grouped("a", prefix + 8, group, prefix if group else 0)
            request.priority = int(rng.random() < 0.2)
            (queue.requeue if rng.random() < 0.2 else queue.add)(request)
            waiting.append(request)
        elif action < 0.45:
            queue.remove(waiting.pop(rng.randrange(len(waiting))))
        elif action < 0.6:
            waiting.remove(queue.pop())
        elif action < 0.8:
            tokens = rng.choice([8, 16, 28])
            if kv.num_free_blocks * 4 >= tokens:  # a request computes a prefix, then ends
                warm(kv, rng.choice(["g0", "g1", "g2", "g3"]), tokens)
        elif action < 0.9 or not fillers:
            # Another request takes blocks: idle ones are evicted, wanted ones last.
            before = kv.wanted_evictions
            filler = grouped("b", 4 * rng.randrange(1, 12), None)
            if kv.allocate(filler, filler.input_tokens) is not None:
                fillers.append(filler)
            shrank += kv.wanted_evictions > before
        else:
            kv.free(fillers.pop(rng.randrange(len(fillers))))
        check_index(index, kv, queues.values())
        kv.check_invariants()
        largest = max([largest, *(len(index.group_of(r).members) for r in waiting)])
    assert shrank > 10  # evictions shortened waiting requests' prefixes
    assert largest > 3  # requests waited in groups


@pytest.mark.parametrize("policy", POLICIES)
def test_the_policies_index_follows_the_cache_throughout_a_run(policy, monkeypatch):
    checks = []
    update = Scheduler.update

    def checking(self, *args, **kwargs):
        outputs = update(self, *args, **kwargs)
        pick = self.policy.pick
        check_index(pick.index, self.kv, pick.queues.values())
        checks.append(len(self.policy))
        return outputs

    monkeypatch.setattr(Scheduler, "update", checking)
    run(policy, requests=80)
    assert len(checks) > 100 and max(checks) > 20


def test_the_index_finds_the_first_evicted_block_of_a_match():
    kv = KVCacheManager(num_blocks=12, block_size=4, enable_prefix_caching=True)
    index = CachedPrefixIndex(lambda group: None)
    index.attach(kv)
    warm(kv, "g", 32)  # eight blocks
    waiting = [grouped("a", 40, "g", 32) for _ in range(3)]
    groups = {id(index.track(request, order=i)) for i, request in enumerate(waiting)}
    assert len(groups) == 1  # one chain: one group
    group = index.group_of(waiting[0])
    assert index.blocks(waiting[0]) == 8
    # Two more requests take the pool: the unwanted blocks go first, then the group's
    # last ones (the LRU evicts a request's last blocks first).
    kv.allocate(grouped("b", 24, None), 24)
    kv.allocate(grouped("c", 8, None), 8)
    evicted = kv.wanted_evicted_since(0)
    assert evicted and len(evicted) == kv.wanted_evictions
    assert index.verify(group) is group
    for request in waiting:
        assert index.blocks(request) == kv.cached_prefix_blocks(request) < 8
    assert index.verify(group) is None  # nothing evicted since
    for request in waiting:
        index.untrack(request)
    assert not kv.index.wanted
    kv.check_invariants()
