"""The scheduler under the paper preset against an independent model of the paper's
router (router_model.py): same admissions, in the same steps, in the same order, and
(for the artifact's VTC) the same counters, on random multi-client workloads.

A second test shows the comparison has teeth: with any one of the router's rules
switched off in the scheduler, some workload makes the two disagree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenfair.core.batch import ExecutorOutput
from tokenfair.core.policies import make_policy
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.scheduler import Scheduler, SchedulerConfig

from .router_model import ModelRequest, RouterModel, run_model

MAX_STEPS = 5000


@dataclass
class RouterWorkload:
    requests: list[tuple[int, str, int, int]]  # arrival step, client, prompt, max_tokens
    pool: int
    max_num_seqs: int
    max_prefill_tokens: int


@st.composite
def router_workloads(draw: st.DrawFn) -> RouterWorkload:
    num_clients = draw(st.integers(2, 4))
    requests = [
        (
            draw(st.integers(0, 40)),
            f"c{draw(st.integers(0, num_clients - 1))}",
            draw(st.integers(1, 30)),
            draw(st.integers(1, 30)),
        )
        for _ in range(draw(st.integers(3, 30)))
    ]
    return RouterWorkload(
        requests=sorted(requests, key=lambda r: r[0]),
        # Pools of a few requests, where the adapters' 32 tokens each matter; every
        # request fits alone (at most 30 + 30 + 32 < 150).
        pool=draw(st.sampled_from([150, 200, 320])),
        max_num_seqs=draw(st.sampled_from([1000, 3])),
        max_prefill_tokens=draw(st.sampled_from([3072, 40])),
    )


def model_run(workload: RouterWorkload, vtc: bool) -> tuple[list[tuple[int, str]], dict]:
    model = RouterModel(workload.pool, workload.max_num_seqs, workload.max_prefill_tokens, vtc)
    requests = [
        ModelRequest(f"r{i}", client, arrival, prompt, max_tokens)
        for i, (arrival, client, prompt, max_tokens) in enumerate(workload.requests)
    ]
    run_model(model, requests, MAX_STEPS)
    return model.admissions, model.counter


def scheduler_run(
    workload: RouterWorkload, policy: Policy, **overrides: object
) -> tuple[list[tuple[int, str]], dict]:
    """Drive the real scheduler one step per time unit, like the model."""
    config = SchedulerConfig.paper(
        kv_tokens=workload.pool,
        max_num_seqs=workload.max_num_seqs,
        max_prefill_tokens=workload.max_prefill_tokens,
        **overrides,
    )
    scheduler = Scheduler(config, policy)
    requests = [
        Request(
            f"r{i}",
            client,
            prompt,
            float(arrival),
            SamplingParams(max_tokens=max_tokens),
            target_output_tokens=max_tokens,
        )
        for i, (arrival, client, prompt, max_tokens) in enumerate(workload.requests)
    ]
    admissions: list[tuple[int, str]] = []
    next_arrival = 0
    for step in range(MAX_STEPS):
        while next_arrival < len(requests) and requests[next_arrival].arrival_s <= step:
            assert scheduler.add_request(requests[next_arrival], step)
            next_arrival += 1
        if next_arrival == len(requests) and not scheduler.has_unfinished():
            return admissions, policy.counters()
        out = scheduler.schedule(step)
        admissions += [(step, s.request.request_id) for s in out.scheduled if s.start == 0]
        sampled = {s.request.request_id: 1 for s in out.scheduled if s.samples}
        scheduler.update(out, ExecutorOutput(sampled=sampled), step)
    raise AssertionError(f"the scheduler did not finish in {MAX_STEPS} steps")


def agrees(workload: RouterWorkload, vtc: bool, policy: Policy, **overrides: object) -> bool:
    expected_order, expected_counters = model_run(workload, vtc)
    order, counters = scheduler_run(workload, policy, **overrides)
    return order == expected_order and (not vtc or counters == expected_counters)


DIFFERENTIAL_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@DIFFERENTIAL_SETTINGS
@given(router_workloads())
def test_fcfs_admissions_match_the_router_model(workload):
    expected, _ = model_run(workload, vtc=False)
    order, _ = scheduler_run(workload, make_policy("fcfs"))
    assert order == expected


@DIFFERENTIAL_SETTINGS
@given(router_workloads())
def test_vtc_artifact_admissions_and_counters_match_the_router_model(workload):
    expected_order, expected_counters = model_run(workload, vtc=True)
    order, counters = scheduler_run(workload, make_policy("vtc-artifact"))
    assert order == expected_order
    assert counters == expected_counters


def artifact_vtc(**changes: bool) -> VTCPolicy:
    options = dict(ties_to_first_seen=True, charge_batch_on_finish=True) | changes
    return VTCPolicy(name="vtc-artifact", lift="artifact", **options)


# Each router rule switched off in the scheduler: (vtc?, policy, config overrides).
RULES_OFF = {
    "retry_admission_every_step": (
        False,
        lambda: make_policy("fcfs"),
        {"retry_admission_every_step": False},
    ),
    "reserve_peak_excludes_last_token": (
        False,
        lambda: make_policy("fcfs"),
        {"reserve_peak_excludes_last_token": False},
    ),
    "reserve_strictly_below_pool": (
        False,
        lambda: make_policy("fcfs"),
        {"reserve_strictly_below_pool": False},
    ),
    "adapter_tokens_per_client": (
        False,
        lambda: make_policy("fcfs"),
        {"adapter_tokens_per_client": 0},
    ),
    "ties_to_first_seen": (True, lambda: artifact_vtc(ties_to_first_seen=False), {}),
    "charge_batch_on_finish": (True, lambda: artifact_vtc(charge_batch_on_finish=False), {}),
}


def random_workload(rng: random.Random) -> RouterWorkload:
    """Like router_workloads(), from a seeded generator: found without shrinking."""
    num_clients = rng.randint(2, 4)
    requests = [
        (
            rng.randint(0, 40),
            f"c{rng.randrange(num_clients)}",
            rng.randint(1, 30),
            rng.randint(1, 30),
        )
        for _ in range(rng.randint(3, 30))
    ]
    return RouterWorkload(
        requests=sorted(requests, key=lambda r: r[0]),
        pool=rng.choice([150, 200, 320]),
        max_num_seqs=rng.choice([1000, 3]),
        max_prefill_tokens=rng.choice([3072, 40]),
    )


@pytest.mark.parametrize("rule", sorted(RULES_OFF))
def test_switching_off_any_router_rule_breaks_the_agreement(rule):
    vtc, policy, overrides = RULES_OFF[rule]
    rng = random.Random(0)
    for _ in range(300):
        if not agrees(random_workload(rng), vtc, policy(), **overrides):
            return
    raise AssertionError(f"{rule} off: scheduler and router model agree on 300 workloads")
