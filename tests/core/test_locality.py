"""Locality-aware policies (vtc-lpm, dlpm), the cached-prefix index behind them, and
charging prompt tokens served from the cache."""

from __future__ import annotations

import pytest

from tokenfair.core.cached_prefix_index import CachedPrefixIndex
from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.policies import PolicyError, make_policy
from tokenfair.core.request import Request
from tokenfair.core.scheduler import Scheduler, SchedulerConfig

from .helpers import fake_step, make_request


def grouped(client: str, input_tokens: int, group: str | None, prefix: int = 0, **kw) -> Request:
    request = make_request(client=client, input_tokens=input_tokens, **kw)
    request.prefix_group, request.prefix_tokens = group, prefix
    return request


def warm(kv: KVCacheManager, group: str, tokens: int) -> None:
    """Leave the first `tokens` of `group`'s text in the cache (computed, then freed)."""
    request = grouped("warm", tokens, group, tokens)
    assert kv.allocate(request, tokens)
    request.num_computed_tokens = tokens
    kv.cache_full_blocks(request)
    kv.free(request)


def test_the_index_follows_growth_and_shrinkage_of_a_waiting_requests_prefix():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    grew: list[list[str]] = []
    index = CachedPrefixIndex(lambda g: grew.append([r.request_id for r in g.requests()]))
    index.attach(kv)
    waiting = grouped("a", 20, "g", 16)
    group = index.track(waiting)
    assert index.blocks(waiting) == 0
    warm(kv, "g", 16)  # four blocks of the group become findable
    assert grew == [[waiting.request_id]] and index.blocks(waiting) == 4
    assert kv.wanted_evictions == 0
    filler = grouped("b", 32, None)
    kv.allocate(filler, 32)  # the whole pool: the wanted blocks are evicted too
    assert kv.wanted_evictions > 0
    assert index.verify(index.group_of(waiting)) is not None  # shorter now
    assert index.blocks(waiting) == 0 and index.group_of(waiting) is group
    index.untrack(waiting)
    kv.check_invariants()


def test_the_index_marks_the_blocks_a_waiting_request_wants():
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_prefix_caching=True)
    index = CachedPrefixIndex(lambda r: None)
    index.attach(kv)
    warm(kv, "wanted", 8)
    warm(kv, "other", 8)  # freed last: plain LRU would keep these and evict "wanted"
    waiting = grouped("a", 12, "wanted", 8)
    index.track(waiting)
    kv.allocate(grouped("b", 8, None), 8)  # two untouched blocks...
    kv.allocate(grouped("c", 8, None), 8)  # ...then two evictions: "other", not "wanted"
    assert kv.cached_prefix_blocks(waiting) == 2
    assert kv.cached_prefix_blocks(grouped("d", 12, "other", 8)) == 0
    index.untrack(waiting)
    kv.check_invariants()


def scheduler_for(policy: str, **config) -> Scheduler:
    settings = dict(kv_tokens=256, block_size=4, enable_prefix_caching=True, max_num_seqs=1)
    settings.update(config)
    return Scheduler(SchedulerConfig(**settings), make_policy(policy))


def test_vtc_lpm_takes_a_clients_longest_cached_prefix_first():
    scheduler = scheduler_for("vtc-lpm")
    warm(scheduler.kv, "a/doc", 32)
    cold = grouped("a", 40, "a/other", 32, request_id="cold", arrival_s=0.0)
    hot = grouped("a", 40, "a/doc", 32, request_id="hot", arrival_s=1.0)
    scheduler.add_request(cold, 0.0)
    scheduler.add_request(hot, 1.0)
    assert scheduler.policy.peek() is hot


def test_vtc_lpm_keeps_vtcs_order_between_clients():
    scheduler = scheduler_for("vtc-lpm")
    policy = scheduler.policy
    warm(scheduler.kv, "b/doc", 32)
    policy.add(grouped("a", 40, None, arrival_s=0.0), 0.0)
    served = grouped("a", 40, None, arrival_s=0.0)
    policy.on_admit(served, True, 0.0)  # a has been served 40 tokens...
    b_hot = grouped("b", 40, "b/doc", 32, arrival_s=1.0)
    policy.add(b_hot, 1.0)  # ...b is lifted to a's counter: ties go to the waiting a
    assert policy.peek().client == "a"
    policy.on_admit(policy.pop(), True, 2.0)
    assert policy.peek() is b_hot


def test_dlpm_prefers_a_cached_prefix_within_the_quantum_then_refills():
    scheduler = scheduler_for("dlpm:100")
    policy = scheduler.policy
    warm(scheduler.kv, "a/system", 32)
    a_requests = [grouped("a", 40, "a/system", 32, arrival_s=float(i)) for i in range(4)]
    b_request = grouped("b", 40, None, arrival_s=0.0)
    for r in [b_request, *a_requests]:
        policy.add(r, r.arrival_s)
    order = []
    while len(policy):
        request = policy.pop()
        order.append(request.client)
        policy.on_admit(request, True, 0.0)
    # b came back from idle first: its lone request goes first. Then a's cached
    # requests until a is a quantum past b; then b has nothing left, so a continues.
    assert order == ["b", "a", "a", "a", "a"]


def test_dlpm_stops_a_cached_client_at_its_quantum():
    scheduler = scheduler_for("dlpm:100")
    policy = scheduler.policy
    warm(scheduler.kv, "a/system", 32)
    for _ in range(4):
        policy.add(grouped("a", 40, "a/system", 32, arrival_s=0.0), 0.0)
        policy.add(grouped("b", 40, None, arrival_s=0.0), 0.0)
    order = []
    for _ in range(8):
        request = policy.pop()
        order.append(request.client)
        policy.on_admit(request, True, 0.0)
    # Each admission charges 40. Both come back from idle: one request each, in order.
    # Round one ends at counter 100: a's cached prefix goes first (40 -> 80 -> 120),
    # then b (uncached) uses its deficit; round two ends at 220, the same again.
    assert order == ["a", "b", "a", "a", "b", "b", "a", "b"]


def test_dlpm_without_any_cached_prefix_follows_the_counters():
    scheduler = scheduler_for("dlpm:1000", enable_prefix_caching=False)
    policy = scheduler.policy
    for client, size in [("a", 10), ("b", 30), ("a", 10), ("b", 30), ("a", 10), ("a", 10)]:
        policy.add(grouped(client, size, None), 0.0)
    order = []
    while len(policy):
        request = policy.pop()
        order.append(request.client)
        policy.on_admit(request, True, 0.0)
    assert order == ["a", "b", "a", "a", "b", "a"]


@pytest.mark.parametrize(("weight", "charged"), [(1.0, 100.0), (0.0, 40.0), (0.5, 70.0)])
def test_charge_cached_tokens_weighs_the_prompt_tokens_served_from_cache(weight, charged):
    policy = make_policy("vtc", charge_cached_tokens=weight)
    request = make_request(client="a", input_tokens=100)
    request.cached_tokens = 60
    policy.on_admit(request, True, 0.0)
    assert policy.counters()["a"] == pytest.approx(charged)


def test_charge_cached_tokens_out_of_range_is_refused():
    with pytest.raises(PolicyError, match="charge_cached_tokens must be between 0 and 1"):
        make_policy("vtc", charge_cached_tokens=1.5)


def test_a_scheduled_request_records_its_cached_prompt_tokens():
    scheduler = scheduler_for("vtc", max_num_seqs=4)
    warm(scheduler.kv, "g", 32)
    request = grouped("a", 40, "g", 32)
    scheduler.add_request(request, 0.0)
    fake_step(scheduler)
    assert request.cached_tokens == 32
    # The paper's cost: the prompt as sent (40), and the token the step produced (2).
    assert scheduler.policy.counters()["a"] == 42
