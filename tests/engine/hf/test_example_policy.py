"""The example policy (examples/least_attained.py), loaded by `module:Class`, makes the
same decisions in the simulator and on a real model.

Both drivers step the same scheduler; only the executor differs (the simulator's
step-time profile, or a tiny random transformers model). Given one clock that advances
by a fixed step, which makes the policy's decaying service identical in both, the two
runs must admit, preempt and finish every request at the same steps, and charge the
same service.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tokenfair.core.policies import make_policy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.clock import VirtualClock
from tokenfair.engine.engine import Engine
from tokenfair.engine.sim.executor import SimExecutor
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.trace_driver import replay

from .hf_models import engine_for, random_prompt

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SPEC = "least_attained:LeastAttainedService(half_life_s=0.5)"
STEP_S = 0.01


class StepClock(VirtualClock):
    """A virtual clock that moves by one fixed step whatever the executor measured."""

    def advance(self, seconds: float) -> None:
        super().advance(STEP_S)


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    sys.modules.pop("least_attained", None)


def workload() -> list[Request]:
    """A heavy client flooding at 0, a light one arriving while it runs, and the
    heavy one again later: a pool small enough to preempt."""
    requests = []
    plan = [(0.0, "heavy", 40, 30)] * 6 + [(0.05, "light", 24, 12)] * 3
    plan += [(0.4, "heavy", 32, 20)] * 2 + [(0.45, "light", 16, 8)] * 2
    for i, (arrival, client, prompt, output) in enumerate(plan):
        tokens = random_prompt(prompt, seed=i)
        requests.append(
            Request(
                f"r{i}",
                client,
                prompt,
                arrival,
                SamplingParams(max_tokens=output, ignore_eos=True),
                prompt_token_ids=tokens,
                target_output_tokens=output,
            )
        )
    return requests


CONFIG = dict(
    kv_tokens=256, block_size=16, max_num_seqs=4, max_batched_tokens=256, admission="optimistic"
)


def run(engine: Engine, clock: StepClock):
    requests = workload()
    result = replay(
        engine,
        requests,
        [None] * len(requests),
        [r.target_output_tokens for r in requests],
        clock.jump_to,
    )
    timeline = [
        (r.request_id, r.scheduled_s, r.first_token_s, r.finish_s, r.preemptions, r.finish_reason)
        for r in requests
    ]
    return timeline, result


def test_the_example_decides_identically_in_the_simulator_and_on_a_real_model():
    sim_clock = StepClock(0.0)
    sim_policy = make_policy(SPEC)
    simulator = Engine(
        Scheduler(SchedulerConfig(**CONFIG), sim_policy),
        SimExecutor(load_profile("a10g-llama-7b")),
        sim_clock,
    )
    simulated, sim_result = run(simulator, sim_clock)

    real = engine_for("llama", **CONFIG)
    real_clock = StepClock(0.0)
    real_policy = make_policy(SPEC)
    engine = Engine(Scheduler(SchedulerConfig(**CONFIG), real_policy), real.executor, real_clock)
    generated, real_result = run(engine, real_clock)

    assert type(real_policy).__name__ == "LeastAttainedService"
    assert simulated == generated
    assert sim_result.steps == real_result.steps
    assert sim_result.preemptions == real_result.preemptions > 0  # the pool was short
    assert sim_policy.attained() == pytest.approx(real_policy.attained(), rel=1e-12)
    # It did schedule by attained service: the light client, arriving behind six heavy
    # requests, starts before the heavy ones still waiting.
    first_light = min(t[1] for t in simulated if t[0] in ("r6", "r7", "r8"))
    assert first_light < max(
        t[1] for t in simulated if t[0] in ("r0", "r1", "r2", "r3", "r4", "r5")
    )
