"""A profile measured on this machine lets the simulator predict a real run's makespan."""

from __future__ import annotations

import random

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

pytest.importorskip("torch")


def small_trace():
    from tokenfair.workloads.trace import TraceRecord

    rng = random.Random(0)
    return [
        TraceRecord(
            arrival_s=i * 0.05,
            client=f"c{i % 3}",
            input_tokens=rng.randint(20, 300),
            output_tokens=rng.randint(20, 120),
            request_id=f"r{i}",
        )
        for i in range(40)
    ]


@pytest.fixture
def one_thread():
    """One intra-op thread: timings then hold up when other processes share the cores
    (with two threads, one preempted thread stalls every parallel op of the other)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_simulated_makespan_matches_the_real_engine_within_25_percent(one_thread):
    from tokenfair.core.policies.registry import make_policy
    from tokenfair.core.scheduler import SchedulerConfig
    from tokenfair.engine.hf.factory import make_hf_engine
    from tokenfair.engine.hf.loader import load_model
    from tokenfair.engine.hf.profile import measure_profile
    from tokenfair.engine.hf.replay import replay_trace
    from tokenfair.engine.sim.profile import profile_from_json
    from tokenfair.engine.sim.simulator import simulate

    loaded = load_model("builtin:tiny", device="cpu")
    profile = measure_profile(loaded)
    assert profile.prefill_token_s > 0
    profile = profile_from_json(profile.to_json())  # what `tokenfair profile --out` writes

    trace = small_trace()
    options = dict(kv_tokens=16384, max_num_seqs=32, max_batched_tokens=1024)
    real = replay_trace(make_hf_engine(loaded, policy="vtc", **options), trace, vocab_size=262)
    simulated = simulate(trace, make_policy("vtc"), profile, SchedulerConfig(**options))

    assert all(r.output_tokens == t.output_tokens for r, t in zip(real.results, trace, strict=True))
    ratio = simulated.makespan_s / real.makespan_s
    assert 0.75 <= ratio <= 1.25, (real.makespan_s, simulated.makespan_s, profile)
