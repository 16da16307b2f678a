"""FairScheduler inside vLLM's real Scheduler, driven by fabricated model outputs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.core.sched.scheduler import Scheduler

from tests.integrations.vllm.harness import add, make_request, make_scheduler, new_ids, run, step
from tests.user_policies import install_module
from tokenfair.core.batch import ExecutorOutput
from tokenfair.core.policies import make_policy
from tokenfair.core.request import Request as CoreRequest
from tokenfair.core.request import SamplingParams as CoreSampling
from tokenfair.core.scheduler import Scheduler as CoreScheduler
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.integrations.vllm import FairScheduler
from tokenfair.integrations.vllm.config import PluginConfigError, load_plugin_config
from tokenfair.integrations.vllm.prefix_cache import VllmPrefixCache

# (request id, tenant, prompt tokens, output tokens), in arrival order.
WORKLOAD = [
    *[(f"a{i}", "a", 48, 12) for i in range(6)],
    *[(f"b{i}", "b", 16, 30) for i in range(3)],
    *[(f"c{i}", "c", 100, 5) for i in range(2)],
]
LATE = [("d0", "d", 20, 10), ("d1", "d", 20, 10)]  # arrive after LATE_STEP steps
LATE_STEP = 5


def expected_counter(workload, tenant: str, weight: float = 1.0) -> float:
    return sum(p + 2 * o for _, t, p, o in workload if t == tenant) / weight


def start_order_vllm(scheduler) -> list[str]:
    add(scheduler, [make_request(scheduler, r, t, p, o) for r, t, p, o in WORKLOAD])
    order: list[str] = []
    steps = 0
    while scheduler.has_requests():
        if steps == LATE_STEP:
            add(scheduler, [make_request(scheduler, r, t, p, o) for r, t, p, o in LATE])
            if isinstance(scheduler, FairScheduler):
                scheduler.lift_of_d = scheduler.driver.counters().get("d", 0.0)
        order += new_ids(step(scheduler))
        steps += 1
    return order


def start_order_tokenfair(max_num_seqs: int, policy: str = "vtc") -> list[str]:
    """The same workload through tokenfair's own scheduler and policy (VTC by default)."""
    # Seat sharing off: vLLM cannot preempt a running request for a waiting one.
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_batched_tokens=2048, kv_tokens=1 << 16, share_seats=False
    )
    scheduler = CoreScheduler(config, make_policy(policy))

    def submit(rows):
        for r, t, p, o in rows:
            sampling = CoreSampling(max_tokens=o, ignore_eos=True)
            scheduler.add_request(CoreRequest(r, t, p, 0.0, sampling, list(range(3, 3 + p))), 0.0)

    submit(WORKLOAD)
    order: list[str] = []
    steps = 0
    while scheduler.has_unfinished():
        if steps == LATE_STEP:
            submit(LATE)
        out = scheduler.schedule(0.0)
        order += [s.request.request_id for s in out.scheduled if s.start == 0]
        sampled = {s.request.request_id: 7 for s in out.scheduled if s.samples}
        scheduler.update(out, ExecutorOutput(sampled=sampled), 0.0)
        steps += 1
    return order


@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_admission_order_is_tokenfairs_vtc_order(tiny_model_dir, max_num_seqs):
    fair = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=max_num_seqs)
    order = start_order_vllm(fair)
    assert order == start_order_tokenfair(max_num_seqs)
    # ...which is not vLLM's arrival order: b and c get in long before a is done.
    stock = start_order_vllm(make_scheduler(tiny_model_dir, Scheduler, max_num_seqs=max_num_seqs))
    assert stock[:6] == [f"a{i}" for i in range(6)]
    assert order.index("b0") < order.index("a2") and order.index("c0") < order.index("a3")
    # Every tenant pays its prompts plus twice its output tokens; the late one on top
    # of the counter it was lifted to on arrival (the smallest waiting counter then).
    counters = fair.driver.counters()
    for tenant in "abc":
        assert counters[tenant] == expected_counter(WORKLOAD, tenant)
    assert counters["d"] - fair.lift_of_d == expected_counter(LATE, "d")


def test_several_admissions_in_one_step_interleave_tenants(tiny_model_dir):
    """Each admission is charged before the next pick of the same step."""
    fair = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=4)
    add(fair, [make_request(fair, f"a{i}", "a", 32, 4) for i in range(4)])
    add(fair, [make_request(fair, f"b{i}", "b", 32, 4) for i in range(4)])
    assert new_ids(step(fair)) == ["a0", "b0", "a1", "b1"]


def test_lift_rule_on_arrival(tiny_model_dir):
    fair = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=1)
    driver = fair.driver
    add(fair, [make_request(fair, f"a{i}", "a", 32, 8) for i in range(3)])
    for _ in range(5):
        step(fair)
    # a still waits: a newcomer starts at the smallest waiting counter, a's.
    add(fair, [make_request(fair, "b0", "b", 8, 4)])
    assert driver.counters()["b"] == driver.counters()["a"] > 0
    run(fair)
    # Nobody waits: a newcomer is lifted to the counter of the tenant admitted last.
    add(fair, [make_request(fair, "c0", "c", 8, 40)])
    step(fair)
    last = driver.counters()["c"]
    for _ in range(3):
        step(fair)
    add(fair, [make_request(fair, "d0", "d", 8, 4)])
    assert driver.counters()["d"] == driver.counters()["c"] > last
    # A tenant coming back from idle keeps a larger counter of its own.
    add(fair, [make_request(fair, "a9", "a", 8, 4)])
    assert driver.counters()["a"] == max(driver.counters()["a"], driver.counters()["d"])


class RecordingScheduler(FairScheduler):
    """Records each victim with the requests it was chosen from."""

    def _preempt_request(self, request, *args, **kwargs):
        # vLLM has already taken the victim off `running`: the rest were candidates.
        self.victims.append((request.request_id, [r.request_id for r in self.running]))
        driver = getattr(self, "driver", None)
        if driver is not None:
            held = self.victim_holdings

            def key(request_id):
                if self.tokenfair_config.share_memory:
                    return driver.holding_victim_key(request_id, held)
                return driver.victim_key(request_id)

            assert all(key(request.request_id) > key(r.request_id) for r in self.running)
        super()._preempt_request(request, *args, **kwargs)


@pytest.mark.parametrize("weights", [{}, {"a": 2.0}])
def test_exact_counters_across_preemption(tiny_model_dir, weights):
    fair = make_scheduler(
        tiny_model_dir,
        RecordingScheduler,
        num_blocks=24,
        max_num_seqs=4,
        tokenfair={"weights": weights} if weights else None,
    )
    fair.victims = []
    workload = [
        *[(f"a{i}", "a", 40, 60) for i in range(4)],
        *[(f"b{i}", "b", 24, 70) for i in range(3)],
        *[(f"c{i}", "c", 56, 30) for i in range(2)],
    ]
    requests = add(fair, [make_request(fair, r, t, p, o) for r, t, p, o in workload])
    run(fair)
    assert fair.victims, "the pool was meant to run out"
    assert all(r.num_output_tokens == o for r, (_, _, _, o) in zip(requests, workload, strict=True))
    counters = fair.driver.counters()
    for tenant in "abc":
        assert counters[tenant] == pytest.approx(
            expected_counter(workload, tenant, weights.get(tenant, 1.0))
        )
    stats = fair.driver.tenants()
    assert sum(s.preemptions for s in stats.values()) == len(fair.victims)
    assert all(s.running == s.waiting == 0 for s in stats.values())


def test_victim_is_newest_request_of_largest_counter(tiny_model_dir):
    def scenario(cls):
        scheduler = make_scheduler(tiny_model_dir, cls, num_blocks=20, max_num_seqs=3)
        scheduler.victims = []
        add(scheduler, [make_request(scheduler, f"a{i}", "a", 16, 100) for i in range(2)])
        for _ in range(10):
            step(scheduler)
        add(scheduler, [make_request(scheduler, "b0", "b", 16, 100)])
        run(scheduler)
        return scheduler

    class RecordingStock(Scheduler):
        def _preempt_request(self, request, *args, **kwargs):
            self.victims.append((request.request_id, [r.request_id for r in self.running]))
            super()._preempt_request(request, *args, **kwargs)

    fair = scenario(RecordingScheduler)
    assert fair.victims[0][0] == "a1"
    # Stock vLLM pushes out its newest admission, the light tenant's request.
    assert scenario(RecordingStock).victims[0][0] == "b0"


def test_the_memory_victim_is_the_tenant_holding_the_most_not_the_largest_counter(
    tiny_model_dir,
):
    # `a` holds one long prompt; `b` three short requests, charged faster (prompt
    # tokens are cheap here): when the pool runs short, b has the larger counter and a
    # holds more blocks.
    def first_victim(share_memory: bool) -> str:
        scheduler = make_scheduler(
            tiny_model_dir,
            RecordingScheduler,
            num_blocks=20,
            max_num_seqs=8,
            tokenfair={"share_memory": share_memory, "w_in": 0.1},
        )
        scheduler.victims = []
        requests = [make_request(scheduler, "a0", "a", 160, 200)]
        requests += [make_request(scheduler, f"b{i}", "b", 16, 200) for i in range(3)]
        add(scheduler, requests)
        for _ in range(200):
            step(scheduler)
            if scheduler.victims:
                counters = scheduler.driver.counters()
                assert counters["b"] > counters["a"]
                return scheduler.victims[0][0]
        raise AssertionError("the pool was meant to run short")

    assert first_victim(True) == "a0"
    assert first_victim(False).startswith("b")


def test_a_tenant_filling_the_pool_lets_a_tenant_within_its_share_start(tiny_model_dir):
    # `b` runs a long generation; `a` then starts a long prompt beside it, and `a`'s
    # next long prompt heads the queue (prompts are cheap: `a`'s counter stays below
    # `b`'s) but does not fit. `b`'s short request waits behind it. With memory shared,
    # `a` (the tenant filling the pool) steps aside and `b`'s request starts at once;
    # vLLM alone stops at the head that does not fit, and `b` waits.
    def steps_to_start(share_memory: bool) -> int:
        scheduler = make_scheduler(
            tiny_model_dir,
            FairScheduler,
            num_blocks=30,
            max_num_seqs=8,
            tokenfair={"share_memory": share_memory, "w_in": 0.1},
        )
        add(scheduler, [make_request(scheduler, "b0", "b", 16, 60)])
        for _ in range(30):
            step(scheduler)
        add(scheduler, [make_request(scheduler, "a0", "a", 240, 100)])
        step(scheduler)
        other_prompt = list(range(200, 440))  # nothing of it cached
        add(scheduler, [make_request(scheduler, "a1", "a", other_prompt, 10)])
        add(scheduler, [make_request(scheduler, "b1", "b", 16, 10)])
        assert scheduler.driver.peek().request_id == "a1"  # the head, and it does not fit
        for steps in range(1, 200):
            if "b1" in new_ids(step(scheduler)):
                assert "a1" in scheduler.driver  # still waiting, not dropped
                return steps
        raise AssertionError("b1 never started")

    assert steps_to_start(True) == 1
    assert steps_to_start(False) > 10


def test_fcfs_policy_schedules_exactly_like_stock_vllm(tiny_model_dir):
    workload = [(f"{t}{i}", t, 16 + 24 * i, 40 + 10 * i) for i in range(3) for t in "xyz"]

    def trace(cls, **kwargs):
        scheduler = make_scheduler(tiny_model_dir, cls, num_blocks=20, max_num_seqs=4, **kwargs)
        add(scheduler, [make_request(scheduler, r, t, p, o) for r, t, p, o in workload])
        return [
            (dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids or ()))
            for out in run(scheduler)
        ]

    stock = trace(Scheduler)
    assert any(preempted for _, preempted in stock), "the pool was meant to run out"
    assert trace(FairScheduler, tokenfair={"policy": "fcfs"}) == stock


def test_priority_policy_schedules_exactly_like_stock_vllm_priority(tiny_model_dir):
    """tokenfair's `priority` is vLLM's priority scheduler: same steps, same victims."""
    workload = [(f"{t}{i}", t, 16 + 24 * i, 40 + 10 * i) for i in range(3) for t in "xyz"]
    priorities = [2, 0, 1, 1, 2, 0, 0, 1, 2]

    def trace(cls, **kwargs):
        scheduler = make_scheduler(
            tiny_model_dir,
            cls,
            num_blocks=20,
            max_num_seqs=4,
            scheduling_policy="priority",
            **kwargs,
        )
        requests = [make_request(scheduler, r, t, p, o) for r, t, p, o in workload]
        for request, priority in zip(requests, priorities, strict=True):
            request.priority = priority
        add(scheduler, requests)
        return [
            (dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids or ()))
            for out in run(scheduler)
        ]

    stock = trace(Scheduler)
    assert any(preempted for _, preempted in stock), "the pool was meant to run out"
    assert trace(FairScheduler, tokenfair={"policy": "priority"}) == stock


@pytest.mark.parametrize("policy", ["vtc", "fcfs", "priority"])
def test_waiting_queue_iterates_and_indexes_in_pop_order(tiny_model_dir, policy):
    """Code that walks vLLM's waiting queue sees what schedule() will take, in order."""
    fair = make_scheduler(
        tiny_model_dir, FairScheduler, num_blocks=14, max_num_seqs=3, tokenfair={"policy": policy}
    )
    add(fair, [make_request(fair, f"a{i}", "a", 40, 60) for i in range(3)])
    add(fair, [make_request(fair, f"b{i}", "b", 16, 60) for i in range(3)])
    preempted = 0
    for _ in range(100):
        preempted += len(step(fair).preempted_req_ids or ())
        if preempted:
            break
    assert preempted, "the pool was meant to run out"
    listed = [r.request_id for r in fair.waiting]
    assert len(listed) == len(fair.waiting) >= 2
    assert [fair.waiting[i].request_id for i in range(len(listed))] == listed
    assert fair.waiting.peek_request().request_id == listed[0]
    # Pops with no admission in between (nothing is charged) take exactly that order.
    popped = [fair.waiting.pop_request().request_id for _ in listed]
    assert popped == listed


def test_reset_prefix_cache_with_running_requests_keeps_exact_charges(tiny_model_dir):
    """Every running request is pushed back (vLLM preempts them all): none pays twice."""
    fair = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=4, prefix_caching=True)
    workload = [("a0", "a", 40, 12), ("a1", "a", 24, 10), ("b0", "b", 32, 14)]
    add(fair, [make_request(fair, r, t, p, o) for r, t, p, o in workload])
    for _ in range(4):
        step(fair)
    running = [r.request_id for r in fair.running]
    assert len(running) == 3
    assert fair.reset_prefix_cache(reset_running_requests=True)
    assert not fair.running
    # They wait again in the order they ran, as in stock vLLM.
    assert [r.request_id for r in fair.waiting] == running
    assert sum(s.preemptions for s in fair.driver.tenants().values()) == 3
    run(fair)
    counters = fair.driver.counters()
    for tenant in "ab":
        assert counters[tenant] == expected_counter(workload, tenant)


def test_pop_and_put_back_is_not_charged(tiny_model_dir):
    fair = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=2)
    driver = fair.driver
    put_backs = []
    put_back = driver.put_back
    driver.put_back = lambda rid: put_backs.append(rid) or put_back(rid)
    add(fair, [make_request(fair, "a0", "a", 32, 30)])
    step(fair)
    held = make_request(fair, "s0", "s", 40, 5)
    # Output of an earlier life still in flight: vLLM pops it and puts it back.
    held.num_stale_output_tokens = 1
    add(fair, [held, make_request(fair, "s1", "s", 8, 3)])
    lifted = driver.counters()["s"]
    for _ in range(7):
        step(fair)
    assert put_backs.count("s0") >= 3
    # Only s1 (started, 8 prompt + 3 x 2 output) was charged meanwhile.
    assert driver.counters()["s"] == lifted + 8 + 2 * 3
    assert driver.tenants()["s"].prompt_tokens == 8
    held.num_stale_output_tokens = 0
    run(fair)
    assert driver.counters()["s"] == lifted + 8 + 6 + 40 + 2 * 5
    assert driver.tenants()["s"].prompt_tokens == 48


@pytest.mark.parametrize(
    ("setting", "share"),
    [
        ({}, 1.0),
        ({"charge_prefix_hits": False}, 0.0),
        ({"charge_cached_tokens": 0.5}, 0.5),
        ({"charge_cached_tokens": 0.0, "charge_prefix_hits": False}, 0.0),
    ],
)
def test_prefix_cache_hits_charged_at_the_chosen_share(tiny_model_dir, setting, share):
    fair = make_scheduler(tiny_model_dir, FairScheduler, prefix_caching=True, tokenfair=setting)
    shared = list(range(100, 164))  # four full blocks
    first = make_request(fair, "p0", "a", [*shared, *range(200, 216)], 4)
    second = make_request(fair, "p1", "a", [*shared, *range(300, 316)], 4)
    add(fair, [first])
    run(fair)
    add(fair, [second])
    run(fair)
    stats = fair.driver.tenants()["a"]
    assert stats.cached_prompt_tokens == 64 and stats.prompt_tokens == 160
    assert fair.driver.counters()["a"] == 160 - (1 - share) * 64 + 2 * 8


def test_charge_settings_that_disagree_are_refused():
    with pytest.raises(PluginConfigError, match="charge_prefix_hits and charge_cached_tokens"):
        load_plugin_config({"tokenfair": {"charge_prefix_hits": True, "charge_cached_tokens": 0}})


def test_cache_aware_policies_inside_vllm_take_the_cached_prefix_first(tiny_model_dir):
    # vLLM's own prefix cache holds tenant a's prompt; b's requests are shorter, so VTC
    # would take b's second request before a's, while dlpm lets a reuse its prefix
    # within its quantum. Under vtc-hit, VTC's choice (b) would miss and a, within the
    # window, has its prompt cached: a's requests go first.
    orders = {}
    for policy in ("vtc", "dlpm", "vtc-hit"):
        fair = make_scheduler(
            tiny_model_dir,
            FairScheduler,
            max_num_seqs=1,
            prefix_caching=True,
            tokenfair={"policy": policy},
        )
        shared = list(range(100, 164))
        add(fair, [make_request(fair, "warm", "a", [*shared, 900], 1)])
        run(fair)
        add(
            fair,
            [
                make_request(fair, "b1", "b", 16, 1),
                make_request(fair, "a1", "a", [*shared, 901], 1),
                make_request(fair, "b2", "b", 16, 1),
                make_request(fair, "a2", "a", [*shared, 902], 1),
            ],
        )
        orders[policy] = [rid for output in run(fair) for rid in new_ids(output)]
    assert orders["vtc"] == ["b1", "a1", "b2", "a2"]
    assert orders["dlpm"] == ["b1", "a1", "a2", "b2"]
    assert orders["vtc-hit"] == ["a1", "a2", "b1", "b2"]


def test_a_users_policy_class_orders_vllms_queue(tiny_model_dir, tmp_path, monkeypatch):
    module = install_module(tmp_path, monkeypatch)
    fair = make_scheduler(
        tiny_model_dir,
        FairScheduler,
        max_num_seqs=1,
        prefix_caching=True,
        tokenfair={"policy": f"{module}:Cached(scale=2)"},
    )
    policy = fair.plugin_policy.policy
    assert isinstance(policy.cache, VllmPrefixCache)  # it overrides attach_prefix_cache
    add(fair, [make_request(fair, f"r{i}", "a", 8, 2, arrival=float(i)) for i in range(3)])
    assert [rid for out in run(fair) for rid in new_ids(out)] == ["r2", "r1", "r0"]
    assert policy.admitted == ["r2", "r1", "r0"]


def test_tenant_from_extra_args_and_the_default(tiny_model_dir):
    fair = make_scheduler(tiny_model_dir, FairScheduler, tokenfair={"default_tenant": "anon"})
    add(
        fair,
        [
            make_request(fair, "r0", None, 8, 2),
            make_request(fair, "r1", 7, 8, 2),  # type: ignore[arg-type]
            make_request(fair, "r2", ["x"], 8, 2),  # type: ignore[arg-type]
            make_request(fair, "r3", "team-a", 8, 2),
        ],
    )
    assert [fair.driver.tenant_of(f"r{i}") for i in range(4)] == ["anon", "7", "anon", "team-a"]
    run(fair)
    assert set(fair.driver.counters()) == {"anon", "7", "team-a"}


def test_priority_and_sjf_policies_order_the_queue(tiny_model_dir):
    fair = make_scheduler(
        tiny_model_dir, FairScheduler, max_num_seqs=1, tokenfair={"policy": "priority"}
    )
    requests = [make_request(fair, f"r{i}", "a", 8, 2) for i in range(3)]
    for request, priority in zip(requests, (5, -1, 0), strict=True):
        request.priority = priority
    add(fair, requests)
    order = [rid for out in run(fair) for rid in new_ids(out)]
    assert order == ["r1", "r2", "r0"]

    sjf = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=1, tokenfair={"policy": "sjf"})
    hinted = [
        make_request(sjf, f"h{i}", "a", 8, 20, extra={"predicted_output_tokens": n})
        for i, n in enumerate((20, 3, 9))
    ]
    add(sjf, hinted)
    assert [rid for out in run(sjf) for rid in new_ids(out)] == ["h1", "h2", "h0"]


def test_abort_while_waiting_and_running(tiny_model_dir):
    from vllm.v1.request import RequestStatus

    fair = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=1)
    add(fair, [make_request(fair, f"a{i}", "a", 16, 50) for i in range(3)])
    for _ in range(4):
        step(fair)
    fair.finish_requests(["a0", "a2"], RequestStatus.FINISHED_ABORTED)  # running, waiting
    run(fair)
    stats = fair.driver.tenants()["a"]
    assert stats.finished == 3 and stats.waiting == stats.running == 0
    # a0 paid its prompt and the tokens it made, a2 nothing, a1 everything.
    assert fair.driver.counters()["a"] == 16 + 2 * 4 + 16 + 2 * 50
    assert len(fair.waiting) == 0 and not fair.running


workloads = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(1, 50), st.integers(1, 20)),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    workload=workloads,
    policy=st.sampled_from(["vtc", "wvtc", "lcf", "fcfs", "priority", "sjf"]),
    num_blocks=st.integers(6, 40),
    max_num_seqs=st.integers(1, 4),
)
def test_every_request_finishes_and_is_charged_exactly_once(
    tiny_model_dir, workload, policy, num_blocks, max_num_seqs
):
    weights = {"a": 2.0, "b": 0.5}
    fair = make_scheduler(
        tiny_model_dir,
        FairScheduler,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        tokenfair={"policy": policy, "weights": weights},
    )
    requests = add(
        fair, [make_request(fair, f"r{i}", t, p, o) for i, (t, p, o) in enumerate(workload)]
    )
    run(fair)
    assert [r.num_output_tokens for r in requests] == [o for _, _, o in workload]
    driver = fair.driver
    assert len(driver) == 0 and not any(f"r{i}" in driver for i in range(len(workload)))
    stats = driver.tenants()
    for tenant, s in stats.items():
        mine = [(p, o) for t, p, o in workload if t == tenant]
        assert (s.prompt_tokens, s.output_tokens) == (
            sum(p for p, _ in mine),
            sum(o for _, o in mine),
        )
        assert s.waiting == s.running == 0 and s.finished == len(mine)
    if policy in ("vtc", "wvtc", "lcf"):
        # Everyone arrived before the first step: nobody was lifted above 0.
        for tenant in stats:
            weight = weights.get(tenant, 1.0)
            expected = sum(p + 2 * o for t, p, o in workload if t == tenant) / weight
            assert driver.counters()[tenant] == pytest.approx(expected)
