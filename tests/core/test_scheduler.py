import random

import pytest

from tokenfair.core.policies import make_policy
from tokenfair.core.request import FinishReason, RequestStatus
from tokenfair.core.scheduler import ConfigError, Scheduler, SchedulerConfig

from .helpers import fake_step, make_request


def engine_config(**overrides):
    settings = dict(kv_tokens=64, block_size=4, max_num_seqs=8, max_batched_tokens=64)
    settings.update(overrides)
    return SchedulerConfig(**settings)


def run_to_end(scheduler, max_steps=10_000):
    now = 0.0
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return now
        fake_step(scheduler, now)
        scheduler.kv.check_invariants()
        now += 1.0
    raise AssertionError("did not finish")


def test_cancelled_running_request_frees_blocks_before_next_step():
    scheduler = Scheduler(engine_config(), make_policy("fcfs"))
    victim, other = make_request(input_tokens=10, output_tokens=50), make_request(output_tokens=50)
    scheduler.add_request(victim, 0)
    scheduler.add_request(other, 0)
    fake_step(scheduler)
    fake_step(scheduler)
    held = len(scheduler.kv.block_table(victim.request_id))
    free_before = scheduler.kv.num_free_blocks
    scheduler.abort(victim.request_id, 1.0)
    assert scheduler.kv.num_free_blocks == free_before + held
    out = scheduler.schedule(2.0)
    assert all(s.request is not victim for s in out.scheduled)
    assert victim.status is RequestStatus.FINISHED and victim.finish_reason is FinishReason.ABORT
    assert victim.finish_s == 1.0


def test_cancelled_waiting_request_is_dropped_at_once():
    scheduler = Scheduler(engine_config(max_num_seqs=1), make_policy("vtc"))
    first, second = make_request(), make_request()
    scheduler.add_request(first, 0)
    scheduler.add_request(second, 0)
    fake_step(scheduler)
    assert scheduler.abort(second.request_id, 0.5)
    assert scheduler.num_waiting == 0
    run_to_end(scheduler)
    assert first.finish_reason is FinishReason.STOP


def test_recomputed_request_still_produces_exactly_its_output_length():
    # 6 blocks of 4 tokens: two requests of 4 + 12 tokens cannot both finish in memory.
    scheduler = Scheduler(engine_config(kv_tokens=24, preemption="recompute"), make_policy("fcfs"))
    a = make_request(input_tokens=4, output_tokens=12)
    b = make_request(input_tokens=4, output_tokens=12)
    scheduler.add_request(a, 0)
    scheduler.add_request(b, 0)
    run_to_end(scheduler)
    assert scheduler.num_preemptions >= 1
    assert b.preemptions >= 1  # the newest admission is the default victim
    for r in (a, b):
        assert r.num_output_tokens == 12
        assert r.finish_reason is FinishReason.STOP
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks


def test_recompute_with_prefix_cache_hits_its_own_blocks():
    config = engine_config(kv_tokens=24, enable_prefix_caching=True)
    scheduler = Scheduler(config, make_policy("fcfs"))
    a = make_request(input_tokens=8, output_tokens=12)
    b = make_request(input_tokens=8, output_tokens=12)
    scheduler.add_request(a, 0)
    scheduler.add_request(b, 0)
    run_to_end(scheduler)
    assert scheduler.num_preemptions >= 1
    assert scheduler.kv.prefix_hit_tokens > 0
    assert b.num_output_tokens == 12


def test_swap_preemption_resumes_without_recompute_and_never_exceeds_swap_area():
    rng = random.Random(3)
    config = engine_config(kv_tokens=48, swap_tokens=16, preemption="swap")
    scheduler = Scheduler(config, make_policy("fcfs"))
    requests = [
        make_request(input_tokens=rng.randint(1, 10), output_tokens=rng.randint(1, 30))
        for _ in range(20)
    ]
    for r in requests:
        scheduler.add_request(r, 0)
    now = 0.0
    swapped_seen = 0
    while scheduler.has_unfinished():
        out = fake_step(scheduler, now)
        swapped_seen += len(out.swap_out)
        kv = scheduler.kv
        assert kv.num_free_swap_blocks >= 0
        assert sum(len(t) for t in kv.swap_tables.values()) <= kv.num_swap_blocks
        kv.check_invariants()
        now += 1
    assert scheduler.num_swaps > 0 and swapped_seen > 0
    for r in requests:
        assert r.num_output_tokens == r.target_output_tokens
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks


def test_swap_falls_back_to_recompute_when_swap_area_is_full():
    config = engine_config(kv_tokens=24, swap_tokens=0, preemption="swap")
    scheduler = Scheduler(config, make_policy("fcfs"))
    a, b = (
        make_request(input_tokens=4, output_tokens=12),
        make_request(input_tokens=4, output_tokens=12),
    )
    scheduler.add_request(a, 0)
    scheduler.add_request(b, 0)
    run_to_end(scheduler)
    assert scheduler.num_preemptions >= 1 and scheduler.num_swaps == 0


def test_priority_preempts_the_lowest_priority_request():
    config = engine_config(kv_tokens=32, max_num_seqs=3)
    scheduler = Scheduler(config, make_policy("priority"))
    low = make_request(input_tokens=4, output_tokens=20, priority=9)
    mid = make_request(input_tokens=4, output_tokens=20, priority=5)
    scheduler.add_request(low, 0)
    scheduler.add_request(mid, 0)
    fake_step(scheduler)
    urgent = make_request(input_tokens=4, output_tokens=20, priority=0)
    scheduler.add_request(urgent, 1)
    # No seat for it (max_num_seqs=3 is not the limit; memory is): run until pressure.
    run_to_end(scheduler)
    assert low.preemptions >= 1
    assert urgent.preemptions == 0
    assert urgent.finish_s <= low.finish_s


def test_priority_arrival_preempts_when_batch_is_full():
    scheduler = Scheduler(engine_config(max_num_seqs=2), make_policy("priority"))
    low = make_request(output_tokens=50, priority=9)
    mid = make_request(output_tokens=50, priority=5)
    for r in (low, mid):
        scheduler.add_request(r, 0)
    fake_step(scheduler)
    urgent = make_request(output_tokens=5, priority=0)
    scheduler.add_request(urgent, 1)
    out = fake_step(scheduler, 1)
    assert any(s.request is urgent for s in out.scheduled)
    assert low.status is RequestStatus.PREEMPTED


def heavy_holds_the_batch(policy_name):
    # Seat sharing off: these are about counter-gap preemption alone (seat sharing has
    # tests/core/test_seat_share.py).
    config = engine_config(
        kv_tokens=1024, max_num_seqs=4, max_batched_tokens=256, share_seats=False
    )
    scheduler = Scheduler(config, make_policy(policy_name))
    heavy = [make_request(client="heavy", input_tokens=8, output_tokens=500) for _ in range(6)]
    for r in heavy:
        scheduler.add_request(r, 0)
    for step in range(40):
        fake_step(scheduler, step)
    assert [r.client for r in scheduler.running] == ["heavy"] * 4
    light = make_request(client="light", input_tokens=8, output_tokens=10)
    scheduler.add_request(light, 40)
    return scheduler, light


def test_vtc_preempt_admits_underserved_client_within_one_step():
    threshold = 50
    scheduler, light = heavy_holds_the_batch(f"vtc-preempt:{threshold}")
    counters = scheduler.policy.counters
    for step in range(41, 100):
        behind = counters()["heavy"] - counters()["light"] > threshold
        out = fake_step(scheduler, step)
        admitted = any(s.request is light for s in out.scheduled)
        # Admitted in the very step its counter falls more than the threshold behind.
        assert admitted == behind, step
        if admitted:
            break
    else:
        raise AssertionError("light client never admitted")
    # The heavy client's 4 running requests gain 2 x 4 per step: about 50/8 steps.
    assert step - 40 <= threshold // 8 + 2
    assert scheduler.num_preemptions == 1
    # The policy's own choice, not memory pressure (no sizing problem to report).
    assert scheduler.num_policy_preemptions == 1
    assert scheduler.num_memory_preemptions == 0


def test_plain_vtc_without_seat_sharing_keeps_an_underserved_client_waiting_for_a_seat():
    scheduler, light = heavy_holds_the_batch("vtc")
    for step in range(41, 200):
        out = fake_step(scheduler, step)
        assert all(s.request is not light for s in out.scheduled)
    assert scheduler.num_preemptions == 0


def test_reserve_admission_never_preempts():
    rng = random.Random(5)
    config = engine_config(kv_tokens=64, admission="reserve")
    scheduler = Scheduler(config, make_policy("fcfs"))
    for _ in range(30):
        out_len = rng.randint(1, 30)
        scheduler.add_request(
            make_request(input_tokens=rng.randint(1, 20), output_tokens=out_len), 0
        )
    run_to_end(scheduler)
    assert scheduler.num_preemptions == 0


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    config = engine_config(kv_tokens=256, max_batched_tokens=16)
    scheduler = Scheduler(config, make_policy("fcfs"))
    r = make_request(input_tokens=40, output_tokens=3)
    scheduler.add_request(r, 0)
    chunks = [fake_step(scheduler, t).scheduled[0].num_new_tokens for t in range(3)]
    assert chunks == [16, 16, 8]
    assert r.num_output_tokens == 1  # only the last chunk samples
    run_to_end(scheduler)
    assert r.num_output_tokens == 3


def test_without_chunking_an_oversized_prompt_runs_alone():
    config = engine_config(kv_tokens=256, max_batched_tokens=16, enable_chunked_prefill=False)
    scheduler = Scheduler(config, make_policy("fcfs"))
    big = make_request(input_tokens=40, output_tokens=2)
    scheduler.add_request(big, 0)
    out = fake_step(scheduler)
    assert out.scheduled[0].num_new_tokens == 40


def test_requests_that_can_never_fit_are_rejected():
    scheduler = Scheduler(engine_config(kv_tokens=32), make_policy("fcfs"))
    huge = make_request(input_tokens=30, output_tokens=10)
    assert not scheduler.add_request(huge, 0)
    assert huge.finish_reason is FinishReason.REJECTED


def test_rpm_rejections_finish_as_rejected():
    scheduler = Scheduler(engine_config(), make_policy("rpm:1"))
    assert scheduler.add_request(make_request(client="a"), 0)
    second = make_request(client="a")
    assert not scheduler.add_request(second, 1)
    assert second.finish_reason is FinishReason.REJECTED and second.finish_s == 1


def test_paper_preset_admits_every_ten_decode_steps_in_separate_prefill_steps():
    config = SchedulerConfig.paper(kv_tokens=10_000)
    scheduler = Scheduler(config, make_policy("fcfs"))
    scheduler.add_request(make_request(input_tokens=10, output_tokens=100), 0)
    first = fake_step(scheduler, 0)
    assert [s.num_new_tokens for s in first.scheduled] == [10]
    late = make_request(input_tokens=10, output_tokens=5)
    scheduler.add_request(late, 0.5)
    kinds = []
    for t in range(1, 13):
        out = fake_step(scheduler, t)
        kinds.append(
            "prefill"
            if any(s.request is late and s.start < late.input_tokens for s in out.scheduled)
            else "decode"
        )
    assert kinds.index("prefill") == 10  # after ten decode steps
    assert kinds.count("prefill") == 1


def test_paper_preset_leaves_first_output_token_uncharged():
    scheduler = Scheduler(SchedulerConfig.paper(), make_policy("vtc"))
    r = make_request(client="a", input_tokens=10, output_tokens=3)
    scheduler.add_request(r, 0)
    run_to_end(scheduler)
    assert scheduler.policy.counters()["a"] == 10 + 2 * 2


def test_force_preempt_swap_delivers_copies_next_step():
    config = engine_config(swap_tokens=32, preemption="swap")
    scheduler = Scheduler(config, make_policy("fcfs"))
    r = make_request(input_tokens=6, output_tokens=10)
    scheduler.add_request(r, 0)
    fake_step(scheduler)
    scheduler.force_preempt(r.request_id, "swap")
    assert r.status is RequestStatus.SWAPPED
    out = fake_step(scheduler, 1)
    assert len(out.swap_out) == 2 and len(out.swap_in) == 2
    run_to_end(scheduler)
    assert r.num_output_tokens == 10


@pytest.mark.parametrize(
    "key, value",
    [("kv_tokens", 0), ("admission", "lazy"), ("preemption", "drop"), ("swap_tokens", -1)],
)
def test_bad_config_names_the_key(key, value):
    with pytest.raises(ConfigError, match=key if key != "kv_tokens" else "kv_tokens"):
        SchedulerConfig(**{key: value})


def test_unknown_setting_is_named():
    with pytest.raises(ConfigError, match="max_seqs"):
        SchedulerConfig.from_dict({"max_seqs": 3})
