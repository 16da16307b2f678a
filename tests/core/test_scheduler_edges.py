"""Edge cases found in review: each test pins one fixed behaviour."""

import pytest

from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.policies import make_policy
from tokenfair.core.policies.priority import PriorityPolicy
from tokenfair.core.request import FinishReason, Request
from tokenfair.core.scheduler import ConfigError, Scheduler, SchedulerConfig

from .helpers import fake_step, make_request


def test_reserve_admits_a_request_that_needs_the_whole_pool():
    config = SchedulerConfig(kv_tokens=64, block_size=16, admission="reserve")
    scheduler = Scheduler(config, make_policy("fcfs"))
    whole = make_request(input_tokens=32, output_tokens=32)
    tiny = make_request(input_tokens=1, output_tokens=1)
    assert scheduler.add_request(whole, 0) and scheduler.add_request(tiny, 0)
    out = fake_step(scheduler)
    assert whole in [s.request for s in out.scheduled]
    for step in range(1, 100):
        if not scheduler.has_unfinished():
            break
        fake_step(scheduler, step)
    assert whole.finish_reason is FinishReason.STOP and tiny.finish_reason is FinishReason.STOP


def test_priority_never_preempts_from_an_empty_batch():
    config = SchedulerConfig(kv_tokens=256, block_size=4)
    scheduler = Scheduler(config, PriorityPolicy())
    head = make_request(priority=-5, input_tokens=4)
    hit = scheduler.kv.lookup_prefix(head)
    assert scheduler.contention.make_room(head, hit, [], 0) is None


def test_aborting_a_preempted_request_refunds_its_predicted_charge():
    config = SchedulerConfig(kv_tokens=256, block_size=4)
    scheduler = Scheduler(config, make_policy("vtc-predict"))
    r = make_request(client="a", input_tokens=10, output_tokens=100, predicted=200, max_tokens=200)
    scheduler.add_request(r, 0)
    for step in range(3):
        fake_step(scheduler, step)
    scheduler.force_preempt(r.request_id, "recompute")
    scheduler.abort(r.request_id, 3)
    # Charged for the prompt and the 3 tokens it produced; the unused prediction is back.
    assert scheduler.policy.counters()["a"] == 10 + 2 * 3


def test_requests_ended_by_a_stop_string_teach_the_length_predictor():
    scheduler = Scheduler(SchedulerConfig(kv_tokens=256, block_size=4), make_policy("vtc-predict"))
    r = make_request(client="a", output_tokens=50, max_tokens=100)
    scheduler.add_request(r, 0)
    for step in range(7):
        fake_step(scheduler, step)
    scheduler.finish(r.request_id, FinishReason.STOP, 7)
    probe = make_request(client="a", max_tokens=100)
    assert scheduler.policy.predictor.predict(probe) == 7


def test_swap_copies_of_an_aborted_request_are_dropped():
    config = SchedulerConfig(kv_tokens=256, block_size=4, swap_tokens=64, preemption="swap")
    scheduler = Scheduler(config, make_policy("fcfs"))
    gone, kept = (
        make_request(input_tokens=8, output_tokens=50),
        make_request(input_tokens=8, output_tokens=50),
    )
    scheduler.add_request(gone, 0)
    scheduler.add_request(kept, 0)
    fake_step(scheduler)
    scheduler.force_preempt(gone.request_id, "swap")
    scheduler.abort(gone.request_id, 1)
    scheduler.force_preempt(kept.request_id, "swap")
    kept_blocks = len(scheduler.kv.swap_tables[kept.request_id])
    out = scheduler.schedule(2)
    swap_blocks = [swap for _, swap in out.swap_out]
    # Only kept's copies: none of them lands twice in one swap block.
    assert len(swap_blocks) == len(set(swap_blocks)) == kept_blocks


def test_prefix_chain_survives_a_block_cached_by_someone_else():
    from tokenfair.core.kv_cache import KVCacheManager

    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first, second = make_request(input_tokens=12), make_request(input_tokens=17)
    first.prompt_token_ids = list(range(12))
    second.prompt_token_ids = list(range(4)) + [100 + i for i in range(13)]
    for r in (first, second):
        kv.allocate(r, r.input_tokens)
    # Both compute the same first block in the same step: only one copy is cached.
    for r in (first, second):
        r.num_computed_tokens = 4
        kv.cache_full_blocks(r)
    for r in (first, second):
        r.num_computed_tokens = r.input_tokens
        kv.cache_full_blocks(r)
    kv.free(second)
    assert kv.lookup_prefix(second).num_tokens == 16  # all four full blocks, not the first


def test_prefix_hit_statistics_count_admitted_requests_only():
    config = SchedulerConfig(kv_tokens=64, block_size=4, max_num_seqs=1, enable_prefix_caching=True)
    scheduler = Scheduler(config, make_policy("fcfs"))
    first, waiting = (
        make_request(input_tokens=8, output_tokens=10),
        make_request(input_tokens=33, output_tokens=1),
    )
    scheduler.add_request(first, 0)
    scheduler.add_request(waiting, 0)
    for step in range(5):
        fake_step(scheduler, step)  # `waiting` is blocked by max_num_seqs all along
    assert scheduler.kv.prefix_query_tokens == 8


def test_vtc_preempt_never_pushes_out_a_request_admitted_in_the_same_step():
    config = SchedulerConfig(kv_tokens=4096, block_size=4, max_num_seqs=2)
    scheduler = Scheduler(config, make_policy("vtc-preempt:0"))
    victims = []
    preempt = scheduler.preempt

    def recording_preempt(victim, out, mode=None, cause="memory"):
        victims.append(victim.num_computed_tokens)
        return preempt(victim, out, mode, cause)

    scheduler.preempt = recording_preempt
    for client in ("a", "b", "c", "d"):
        scheduler.add_request(make_request(client=client, input_tokens=50, output_tokens=30), 0)
    for step in range(60):
        fake_step(scheduler, step)
    assert victims, "threshold 0 must preempt"
    assert all(computed > 0 for computed in victims)  # every victim had run a step


def test_a_fairness_preemption_gives_the_victims_tokens_back_to_the_step_budget():
    # Four decoding requests leave 1 token of the 5-token budget; the one preempted for
    # the light client gives its token back, so the light prompt's 2 tokens both run
    # in that step instead of a 1-token chunk.
    config = SchedulerConfig(kv_tokens=1024, block_size=4, max_num_seqs=4, max_batched_tokens=5)
    scheduler = Scheduler(config, make_policy("vtc-preempt:0"))
    for _ in range(6):
        scheduler.add_request(make_request(client="heavy", input_tokens=1, output_tokens=200), 0)
    for step in range(5):
        fake_step(scheduler, step)
    assert len(scheduler.running) == 4
    light = make_request(client="light", input_tokens=2, output_tokens=5)
    scheduler.add_request(light, 5)
    for step in range(5, 20):
        out = fake_step(scheduler, step)
        if scheduler.num_policy_preemptions:
            break
    assert [s.num_new_tokens for s in out.scheduled if s.request is light] == [2]
    assert sum(s.num_new_tokens for s in out.scheduled) == config.max_batched_tokens
    assert scheduler.num_policy_preemptions == 1 and scheduler.num_memory_preemptions == 0


def test_allocate_decides_and_takes_nothing_when_the_pool_is_short():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a, b = make_request(input_tokens=8), make_request(input_tokens=12)
    assert kv.allocate(a, 8) and kv.num_free_blocks == 2
    assert kv.allocate(b, 12) is None  # needs 3 blocks, 2 free
    assert kv.num_free_blocks == 2 and b.request_id not in kv.holders()
    assert kv.blocks_for(9) == 3 and kv.blocks_needed(a, 9) == 1
    kv.check_invariants()


def test_a_trace_request_stops_at_its_output_length_under_a_larger_max_tokens():
    scheduler = Scheduler(SchedulerConfig.paper(kv_tokens=1000), make_policy("fcfs"))
    request = make_request(input_tokens=10, output_tokens=5, max_tokens=50)
    request.eos_token_ids = frozenset()  # no EOS: only the target can stop it
    scheduler.add_request(request, 0)
    for step in range(20):
        fake_step(scheduler, step)
    assert request.num_output_tokens == 5
    assert request.finish_reason is FinishReason.STOP


def test_router_settings_without_reserve_admission_are_refused():
    with pytest.raises(ConfigError, match="adapter_tokens_per_client"):
        SchedulerConfig(adapter_tokens_per_client=32)
    config = SchedulerConfig.paper()
    assert config.retry_admission_every_step and config.reserve_strictly_below_pool
    assert config.reserve_peak_excludes_last_token and config.adapter_tokens_per_client == 32


def test_the_output_count_follows_the_output_through_preemption_and_swap():
    # num_output_tokens is a plain field (read once per generated token), not a
    # property over output_token_ids: every path that adds tokens keeps it current.
    assert Request("r", "a", 4, 0.0, output_token_ids=[7, 8]).num_output_tokens == 2
    config = SchedulerConfig(kv_tokens=256, block_size=4, swap_tokens=64, preemption="swap")
    scheduler = Scheduler(config, make_policy("vtc"))
    a, b = make_request(output_tokens=20), make_request(output_tokens=20)
    for request in (a, b):
        scheduler.add_request(request, 0)
    for step in range(40):
        if step == 3:
            scheduler.force_preempt(a.request_id, "recompute")
        if step == 6:
            scheduler.force_preempt(b.request_id, "swap")
        fake_step(scheduler, step)
        for request in (a, b):
            assert request.num_output_tokens == len(request.output_token_ids)
    assert a.num_output_tokens == b.num_output_tokens == 20
    a.extend_output([1, 2])
    a.append_output(3)
    assert a.num_output_tokens == len(a.output_token_ids) == 23


def test_an_engines_scheduler_settings_are_checked_when_given_not_when_built():
    from tokenfair.core.scheduler_config import SchedulerOverrides

    with pytest.raises(ConfigError, match="max_num_seq"):
        SchedulerOverrides.of(max_num_seq=8)  # a typo: the known keys are listed
    with pytest.raises(ConfigError, match="block_size must be >= 1"):
        SchedulerOverrides.of(block_size=0)
    with pytest.raises(ConfigError, match="kv_tokens"):
        SchedulerOverrides.of(kv_tokens=4096)  # the backend sizes the pool
    given = SchedulerOverrides.of(block_size=32)
    assert given.value("block_size") == 32 and given.value("max_num_seqs") == 256
    config = given.config(1024)
    assert (config.block_size, config.kv_tokens, config.num_blocks) == (32, 1024, 32)


def test_a_request_pays_its_prompt_once_though_it_is_pushed_out_and_started_again():
    from tokenfair.core.policies import make_policy

    from .helpers import fake_step, make_request

    policy = make_policy("vtc")
    scheduler = Scheduler(SchedulerConfig(kv_tokens=1024, block_size=16), policy)
    request = make_request("a", input_tokens=100, output_tokens=50)
    scheduler.add_request(request, 0.0)
    fake_step(scheduler)  # its prompt, and its first output token
    paid = policy.counters()["a"]
    first_seq = request.admit_seq
    scheduler.force_preempt(request.request_id, "recompute")
    fake_step(scheduler, 1.0)  # back: its prompt is computed again, and its next token
    # Only the one token more (w_out 2): the recompute is the system's doing.
    assert policy.counters()["a"] == paid + 2.0
    assert request.admit_seq > first_seq  # the newest start: the first victim again
