"""vtc-hit: VTC's choice while it hits the prefix cache; on a miss, the longest cached
prefix among the clients within the window of the least served."""

from __future__ import annotations

import pytest

from tokenfair.core.policies import PolicyError, make_policy

from .test_locality import grouped, scheduler_for, warm


def admit_all(policy) -> list[str]:
    order = []
    while len(policy):
        request = policy.pop()
        order.append(request.request_id)
        policy.on_admit(request, True, 0.0)
    return order


def test_vtcs_choice_goes_when_it_hits_though_another_has_more_cached():
    scheduler = scheduler_for("vtc-hit:1000")
    policy = scheduler.policy
    warm(scheduler.kv, "a/doc", 8)
    warm(scheduler.kv, "b/doc", 32)
    policy.add(grouped("a", 40, "a/doc", 8, request_id="a1"), 0.0)
    policy.add(grouped("b", 40, "b/doc", 32, request_id="b1"), 0.0)
    # Both come from idle at counter 0; ties go to the first seen, a, whose request
    # finds 8 tokens cached: a hit, so VTC's order stands.
    assert admit_all(policy) == ["a1", "b1"]


def test_on_a_miss_a_cached_client_within_the_window_goes_until_it_leaves_the_window():
    scheduler = scheduler_for("vtc-hit:100")
    policy = scheduler.policy
    warm(scheduler.kv, "b/doc", 32)
    for i in range(4):
        policy.add(grouped("a", 40, "a/cold", 32, request_id=f"a{i}"), 0.0)
        policy.add(grouped("b", 40, "b/doc", 32, request_id=f"b{i}"), 0.0)
    # a is VTC's choice (first seen) and misses; b hits: b's requests go while b's
    # counter is below a's + 100 (each admission charges 40): 0, 40, 80, then 120 is
    # past 100, and a's miss goes.
    assert admit_all(policy)[:4] == ["b0", "b1", "b2", "a0"]


def test_without_any_cached_prefix_it_follows_the_counters():
    orders = {}
    for name in ("vtc", "vtc-hit:1000"):
        scheduler = scheduler_for(name, enable_prefix_caching=False)
        policy = scheduler.policy
        for i, (client, size) in enumerate([("a", 10), ("b", 30), ("a", 10), ("b", 30), ("a", 10)]):
            policy.add(grouped(client, size, None, request_id=f"r{i}"), 0.0)
        orders[name] = admit_all(policy)
    assert orders["vtc-hit:1000"] == orders["vtc"]


@pytest.mark.parametrize("spec", ["vtc-hit:0", "vtc-hit:-5", "vtc-hit:x"])
def test_a_bad_window_is_refused(spec):
    with pytest.raises(PolicyError, match="vtc-hit"):
        make_policy(spec)


def test_a_pop_takes_what_its_peek_chose_though_the_cache_changed_between():
    # a is VTC's choice and misses; b, a little ahead, hits: the peek returns b's
    # request. The pool then evicts b's document before the pop (an admission's
    # allocation may): the pop must still take the request the peek returned, the one
    # the driver planned for, not choose again.
    scheduler = scheduler_for("vtc-hit:1000")
    policy = scheduler.policy
    warm(scheduler.kv, "b/doc", 32)
    policy.add(grouped("a", 40, "a/cold", 32, request_id="a1"), 0.0)
    policy.add(grouped("b", 40, "b/doc", 32, request_id="b1"), 0.0)
    policy.ledger.charge("b", 10.0)
    peeked = policy.peek()
    assert peeked is not None and peeked.request_id == "b1"
    filler = grouped("z", scheduler.kv.num_free_blocks * scheduler.kv.block_size, None)
    assert scheduler.kv.allocate(filler, filler.input_tokens)  # b's document evicted
    assert policy.pop() is peeked


@pytest.mark.parametrize("name", ["vtc", "vtc-hit:1000", "dlpm:1000", "vtc-lpm"])
def test_a_pop_after_the_peeked_request_left_takes_the_next(name):
    scheduler = scheduler_for(name, enable_prefix_caching=False)
    policy = scheduler.policy
    policy.add(grouped("a", 40, None, request_id="a1"), 0.0)
    policy.add(grouped("b", 40, None, request_id="b1"), 0.0)
    peeked = policy.peek()
    assert peeked is not None
    policy.remove(peeked)  # aborted while at the head
    taken = policy.pop()
    assert taken is not peeked and len(policy) == 0
