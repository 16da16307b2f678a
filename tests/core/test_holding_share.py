"""What a tenant holds, shared by weight: KV memory and the step's prompt tokens.

The report it answers: a tenant flooding long prompts filled the KV pool and the step's
token budget; a light tenant far under its share waited 21x its alone time for a first
token, and the memory victim could be the light tenant's request.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.helpers import fake_step, make_request
from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.policies.memory_share import MemoryAsk, memory_share_victim
from tokenfair.core.policies.registry import make_policy
from tokenfair.core.request import RequestStatus
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.core.step_share import newcomer_chunk


def scheduler(policy: str = "vtc", **overrides) -> Scheduler:
    settings_ = dict(
        kv_tokens=1024,
        block_size=16,
        max_num_seqs=64,
        max_batched_tokens=4096,
        share_memory=True,
        step_share_tokens=1024,
    )
    settings_.update(overrides)
    return Scheduler(SchedulerConfig(**settings_), make_policy(policy))


def steps_until_first_token(sched: Scheduler, request, start: float = 1.0) -> int:
    for step in range(1, 400):
        fake_step(sched, start + step * 0.01)
        if request.num_output_tokens:
            return step
    return 10**6


# --- the block pool knows what each tenant holds ---


def test_the_pool_counts_what_each_tenant_holds_a_shared_block_once() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = make_request("a", input_tokens=12)
    kv.allocate(first, 12)
    first.num_computed_tokens = 12
    kv.cache_full_blocks(first)
    assert kv.holdings() == {"a": 3}
    again = make_request("a", input_tokens=12)
    again.block_hashes[:] = kv.block_hashes(first, 2)  # the same first two blocks
    hit = kv.lookup_prefix(again)
    assert hit.num_tokens == 8
    kv.allocate(again, 12, hit)
    assert kv.holdings() == {"a": 4}  # two shared blocks counted once, one new
    other = make_request("b", input_tokens=5)
    kv.allocate(other, 5)
    assert kv.held_by("b") == 2
    kv.check_invariants()
    kv.free(first)
    assert kv.holdings() == {"a": 3, "b": 2}  # the shared blocks are still held by `again`
    kv.free(again)
    kv.free(other)
    assert kv.holdings() == {}
    kv.check_invariants()


# --- victims by what is held ---


@settings(max_examples=200, deadline=None)
@given(
    holdings=st.dictionaries(st.sampled_from("abcde"), st.integers(0, 200), min_size=1),
    weights=st.dictionaries(st.sampled_from("abcdef"), st.floats(0.1, 10)),
    head_client=st.sampled_from("abcdef"),
    need=st.integers(1, 100),
)
def test_the_memory_victim_is_never_under_its_share_and_the_head_stays_within_its_own(
    holdings, weights, head_client, need
) -> None:
    pool = 1000
    running = [make_request(c) for c, held in holdings.items() for _ in range(1 + held // 50)]
    for seq, request in enumerate(running):
        request.admit_seq = seq
    head = make_request(head_client)

    def weight(c):
        return weights.get(c, 1.0)

    ask = MemoryAsk(head, need, running, holdings, pool, block_size=16)
    victim = memory_share_victim(ask, weight)
    tenants = {r.client for r in running} | {head_client}
    total = sum(weight(c) for c in tenants)
    share = {c: pool * weight(c) / total for c in tenants}
    head_after = (holdings.get(head_client, 0) + need) / weight(head_client)
    if victim is None:
        over = [c for c in tenants if c != head_client and holdings.get(c, 0) > share[c]]
        if over and holdings.get(head_client, 0) + need <= share[head_client]:
            # Only when the furthest over would be left below the head's tenant.
            furthest = max(over, key=lambda c: holdings[c] / weight(c))
            newest = max((r for r in running if r.client == furthest), key=lambda r: r.admit_seq)
            left = (holdings[furthest] - ask.blocks_of(newest)) / weight(furthest)
            assert left < head_after
        return
    assert holdings.get(head_client, 0) + need <= share[head_client]
    assert victim.client != head_client and holdings[victim.client] > share[victim.client]
    # The furthest over per unit of weight, its newest request, and it still holds as
    # much per unit of weight as the head's tenant after the move (no trading back).
    per_weight = {c: holdings.get(c, 0) / weight(c) for c in tenants if c != head_client}
    assert per_weight[victim.client] == max(per_weight.values())
    assert victim.admit_seq == max(r.admit_seq for r in running if r.client == victim.client)
    left = (holdings[victim.client] - ask.blocks_of(victim)) / weight(victim.client)
    assert left >= head_after


def test_two_tenants_asking_alike_do_not_trade_memory_back_and_forth() -> None:
    # "a" is over its third of the pool by less than one of its requests: taking that
    # request for "b" would leave "a" below "b", whose next head would take it back.
    running = [make_request("a", input_tokens=320) for _ in range(5)]  # 20 blocks each
    running.append(make_request("c", input_tokens=160))
    for seq, request in enumerate(running):
        request.admit_seq = seq
    holdings = {"a": 110, "b": 95, "c": 10}
    head = make_request("b")
    assert (
        memory_share_victim(MemoryAsk(head, 5, running, holdings, 300, 16), lambda c: 1.0) is None
    )
    # Far over, "a" gives its newest request.
    holdings["a"] = 150
    victim = memory_share_victim(MemoryAsk(head, 5, running, holdings, 300, 16), lambda c: 1.0)
    assert victim is running[4]


@settings(max_examples=200, deadline=None)
@given(
    wants=st.dictionaries(st.sampled_from("abcde"), st.integers(0, 600), min_size=1),
    weights=st.dictionaries(st.sampled_from("abcde"), st.floats(0.1, 10)),
    pool=st.integers(1, 1500),
)
def test_the_fair_level_shares_the_pool_max_min_by_weight(wants, weights, pool) -> None:
    # Max-min by weight: a tenant asking less than its part keeps what it asks, the
    # others split the rest by weight, and the pool is handed out whole when asked.
    def weight(c):
        return weights.get(c, 1.0)

    head_client = next(iter(wants))
    running = [make_request(c) for c in wants if c != head_client]
    holdings = {c: w for c, w in wants.items() if c != head_client}
    ask = MemoryAsk(make_request(head_client), wants[head_client], running, holdings, pool, 16)
    level = ask.fair_level(weight)
    given_ = {c: min(want, level * weight(c)) for c, want in wants.items()}
    if sum(wants.values()) <= pool:
        assert level == float("inf")
        return
    assert sum(given_.values()) == pytest.approx(pool)
    capped = [c for c in wants if wants[c] > level * weight(c) * (1 + 1e-9)]
    assert capped  # somebody is short, and each short tenant gets the same per weight
    for c in wants:
        if c not in capped:
            assert given_[c] == pytest.approx(wants[c])


@pytest.mark.parametrize("policy", ["vtc", "vtc-preempt:0"])
def test_a_memory_shortage_pushes_out_the_tenant_holding_the_most(policy: str) -> None:
    # The heavy tenant holds most of the pool; the light tenant, admitted last, is the
    # most-served by counter after its lift, which used to make it VTC's victim (and
    # vtc-preempt's, for the heavy tenant's next request).
    sched = scheduler(policy, kv_tokens=640, step_share_tokens=None)
    heavy = [make_request("heavy", input_tokens=200, output_tokens=400) for _ in range(2)]
    for request in heavy:
        sched.add_request(request, 0.0)
    fake_step(sched, 0.0)
    light = make_request("light", input_tokens=100, output_tokens=400)
    sched.add_request(light, 0.5)
    preempted: list = []
    for step in range(1, 300):
        fake_step(sched, 0.5 + step * 0.01)
        preempted += [r for r in [*heavy, light] if r.preemptions and r not in preempted]
        if preempted:
            break
    assert preempted and all(r.client == "heavy" for r in preempted)
    assert light.status is RequestStatus.RUNNING


# --- the memory share at admission ---


def fill_pool_with(sched: Scheduler, client: str, count: int, tokens: int) -> list:
    requests = [make_request(client, input_tokens=tokens, output_tokens=100) for _ in range(count)]
    for request in requests:
        sched.add_request(request, 0.0)
    for step in range(count + 1):
        fake_step(sched, step * 0.01)
    return requests


def test_a_light_tenant_takes_memory_from_the_tenant_holding_the_pool() -> None:
    for share in (True, False):
        sched = scheduler(kv_tokens=4096, share_memory=share, step_share_tokens=None)
        heavy = fill_pool_with(sched, "heavy", 3, 1300)
        assert sched.kv.num_free_blocks < 12
        light = make_request("light", input_tokens=200, output_tokens=4)
        sched.add_request(light, 1.0)
        steps = steps_until_first_token(sched, light)
        if share:
            # It waits the memory patience, then the newest heavy request gives way.
            assert steps <= sched.config.memory_patience_steps + 2
            newest = max(heavy, key=lambda r: r.admit_seq)
            assert newest.preemptions == 1
        else:
            assert steps > 50  # until a heavy generation ends


def test_a_tenant_over_its_memory_share_steps_aside_for_one_within_its_own() -> None:
    # The heavy tenant's next request heads the queue (its counter is the lowest) but
    # does not fit; the light one behind it fits and must not wait behind it.
    sched = scheduler(kv_tokens=4096, step_share_tokens=None, memory_patience_steps=10**6)
    fill_pool_with(sched, "heavy", 3, 1300)
    blocked = make_request("heavy", input_tokens=1300, output_tokens=4)
    sched.add_request(blocked, 1.0)
    light = make_request("light", input_tokens=20, output_tokens=4)
    sched.add_request(light, 1.0)
    assert sched.kv.num_free_blocks >= 2  # room for the light request only
    assert steps_until_first_token(sched, light) == 1
    assert blocked.status is RequestStatus.WAITING


def test_a_tenant_holding_more_than_a_third_still_passes_the_tenant_filling_the_pool() -> None:
    # Three tenants: "busy" holds more of the pool than "heavy" (many small requests,
    # as chat tenants decoding slowly do), but "heavy"'s blocked head asks the most.
    # Shared max-min, "busy" is within its share (what "quiet" does not use is
    # split between the two): it must not wait behind "heavy"'s head. Split a third
    # each, both would be over, nobody would step aside, and "busy" would wait for a
    # generation to end.
    sched = scheduler(kv_tokens=4096, step_share_tokens=None, memory_patience_steps=10**6)
    fill_pool_with(sched, "busy", 15, 100)  # 15 x 7 blocks = 105
    fill_pool_with(sched, "heavy", 1, 1400)  # 88 blocks
    fill_pool_with(sched, "quiet", 1, 40)  # 3 blocks
    held = sched.kv.holdings()
    assert held["busy"] > held["heavy"] > 256 / 3  # both over a third of the pool
    blocked = make_request("heavy", input_tokens=1300, output_tokens=4)
    sched.add_request(blocked, 1.0)
    busy = make_request("busy", input_tokens=20, output_tokens=4)
    sched.add_request(busy, 1.0)
    assert sched.policy.peek() is blocked  # "heavy"'s counter is the lowest
    assert sched.kv.num_free_blocks >= 2  # room for the small request only
    assert steps_until_first_token(sched, busy) == 1
    assert blocked.status is RequestStatus.WAITING


def test_a_light_tenant_passes_every_long_prompt_tenant_waiting_for_memory() -> None:
    # Two long-prompt tenants: "big" holds the most of the pool, "second" less, and
    # "second"'s head (the lowest counter) does not fit. Only the tenant asking the
    # most used to step aside, so "second"'s head stopped admission and the light
    # tenant waited for a long generation to end. Every blocked head lets a tenant
    # within its share pass.
    sched = scheduler(kv_tokens=4096, step_share_tokens=None, memory_patience_steps=10**6)
    fill_pool_with(sched, "big", 2, 1300)  # 2 x 82 blocks
    fill_pool_with(sched, "second", 1, 1000)  # 63 blocks
    blocked = make_request("second", input_tokens=1300, output_tokens=4)
    sched.add_request(blocked, 1.0)
    light = make_request("light", input_tokens=20, output_tokens=4)
    sched.add_request(light, 1.0)
    assert sched.policy.peek() is blocked  # "second"'s counter is the lowest
    held = sched.kv.holdings()
    assert held["big"] > held["second"]  # "second" is not the tenant asking the most
    assert 2 <= sched.kv.num_free_blocks < 82  # room for the light request only
    assert steps_until_first_token(sched, light) == 1
    assert blocked.status is RequestStatus.WAITING


def test_a_tenant_over_its_share_does_not_pass_a_head_waiting_for_memory() -> None:
    # "heavy"'s head waits for memory; "busy", holding more than its max-min share
    # counting what that head asks, must not take the free blocks before it.
    sched = scheduler(kv_tokens=4096, step_share_tokens=None, memory_patience_steps=10**6)
    fill_pool_with(sched, "busy", 20, 100)  # 140 blocks
    fill_pool_with(sched, "heavy", 1, 1300)  # 82 blocks
    blocked = make_request("heavy", input_tokens=1500, output_tokens=4)
    sched.add_request(blocked, 1.0)
    busy = make_request("busy", input_tokens=20, output_tokens=4)
    sched.add_request(busy, 1.0)
    assert sched.policy.peek() is blocked
    looked_up: list[str] = []
    lookup = sched.kv.lookup_prefix

    def recording(request):
        looked_up.append(request.client)
        return lookup(request)

    sched.kv.lookup_prefix = recording  # type: ignore[method-assign]
    fake_step(sched, 1.0)
    assert busy.status is RequestStatus.WAITING and blocked.status is RequestStatus.WAITING
    # Over its share with nothing asked, "busy" is turned away before its prefix is
    # looked up (a lookup walks the request's whole prompt).
    assert looked_up == ["heavy"]


def test_a_tenant_alone_fills_the_whole_pool() -> None:
    sched = scheduler(kv_tokens=4096, step_share_tokens=None)
    fill_pool_with(sched, "heavy", 3, 1300)
    assert sched.kv.num_free_blocks < 12 and sched.num_preemptions == 0


# --- the step shared ---


def test_a_short_prompt_starts_beside_a_long_prefill_in_a_short_step() -> None:
    for limit in (256, None):
        sched = scheduler(kv_tokens=100_000, step_share_tokens=limit)
        chat = make_request("chat", input_tokens=20, output_tokens=50)
        sched.add_request(chat, 0.0)
        fake_step(sched, 0.0)
        long = make_request("long", input_tokens=4000, output_tokens=4)
        sched.add_request(long, 0.1)
        out = fake_step(sched, 0.1)
        long_tokens = sum(s.num_new_tokens for s in out.scheduled if s.request is long)
        newcomer = make_request("chat", input_tokens=30, output_tokens=4)
        sched.add_request(newcomer, 0.2)
        out = fake_step(sched, 0.2)
        newcomer_step = sum(s.num_new_tokens for s in out.scheduled if s.request is long)
        if limit is None:
            assert long_tokens == 4000  # the whole prompt in one long step
        else:
            assert long_tokens == limit
            assert newcomer.num_output_tokens == 1  # its first token in the next step...
            assert newcomer_step == newcomer_chunk(limit)  # ...a short one
            assert chat.num_output_tokens == 3  # the decode goes on at every step


def test_a_tenant_first_in_line_takes_its_share_when_another_waits_behind_it() -> None:
    # Nothing runs; a long prompt heads the queue and a short one of another tenant
    # waits behind it: the long prompt's first chunk is the step's share, not all of
    # it, so the short one starts in the same short step.
    sched = scheduler(kv_tokens=100_000, step_share_tokens=256)
    long = make_request("long", input_tokens=4000, output_tokens=4)
    sched.add_request(long, 0.0)
    chat = make_request("chat", input_tokens=30, output_tokens=4)
    sched.add_request(chat, 0.0)
    assert sched.policy.peek() is long
    out = fake_step(sched, 0.0)
    planned = {s.request.client: s.num_new_tokens for s in out.scheduled}
    assert planned == {"long": newcomer_chunk(256), "chat": 30}  # cut further: chat starts in it


def test_several_long_prompt_tenants_share_one_step_share_between_them() -> None:
    # Three tenants prefill long prompts beside a chat tenant decoding: together their
    # chunks take the step's share once, by weight, not once each (three times the
    # step a light tenant's decode waits for).
    sched = Scheduler(
        SchedulerConfig(kv_tokens=200_000, max_batched_tokens=8192, step_share_tokens=768),
        make_policy("wvtc", weights={"long-a": 2.0}),
    )
    chat = make_request("chat", input_tokens=20, output_tokens=200)
    sched.add_request(chat, 0.0)
    fake_step(sched, 0.0)
    longs = [make_request(f"long-{n}", input_tokens=6000, output_tokens=4) for n in "abc"]
    for request in longs:
        sched.add_request(request, 0.1)
    for step in range(1, 6):
        out = fake_step(sched, 0.1 + step * 0.01)
        prompt = {s.request.client: s.num_new_tokens for s in out.scheduled if s.request in longs}
        assert sum(prompt.values()) <= 768
        if step > 1:  # all three prefilling: shared by weight (2:1:1)
            assert prompt == {"long-a": 384, "long-b": 192, "long-c": 192}
        assert any(s.request is chat for s in out.scheduled)  # the decode goes on


def test_a_share_a_waiting_tenant_cannot_use_goes_to_the_running_prefill() -> None:
    # "blocked"'s request waits for the seat "long" holds; the step's share set aside
    # for it would go unused, and "long"'s prefill would crawl at half a share a step,
    # holding its seat and memory longer. What a waiting tenant cannot use tops up the
    # prefill.
    sched = scheduler(
        kv_tokens=100_000, max_num_seqs=1, max_batched_tokens=2048, step_share_tokens=768
    )
    long = make_request("long", input_tokens=6000, output_tokens=4)
    sched.add_request(long, 0.0)
    fake_step(sched, 0.0)  # alone: its first chunk is the whole budget
    blocked = make_request("blocked", input_tokens=5000, output_tokens=4)
    sched.add_request(blocked, 0.1)
    out = fake_step(sched, 0.1)
    assert blocked.status is RequestStatus.WAITING
    assert [(s.request.client, s.num_new_tokens) for s in out.scheduled] == [("long", 768)]


def test_a_tenant_alone_takes_the_whole_step() -> None:
    sched = scheduler(kv_tokens=100_000, step_share_tokens=256)
    long = make_request("long", input_tokens=4000, output_tokens=4)
    sched.add_request(long, 0.0)
    out = fake_step(sched, 0.0)
    assert out.scheduled[0].num_new_tokens == 4000
