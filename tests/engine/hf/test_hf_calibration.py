"""The calibration pipeline's arithmetic: step records -> fitted profile -> simulated run.

Nothing here compares against the machine's speed (that belongs to benchmarks/): the
fit must recover known coefficients from synthetic step records, the simulator must
time a run exactly as the fitted profile predicts, and the real engine's step records
must describe the batches it ran.
"""

from __future__ import annotations

import random

import pytest

from tokenfair.core.policies.registry import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import (
    LinearStepProfile,
    fit_linear_profile,
    profile_from_json,
)
from tokenfair.engine.sim.simulator import simulate
from tokenfair.workloads.trace import TraceRecord

KNOWN = LinearStepProfile(
    name="known",
    base_s=0.004,
    prefill_base_s=0.002,
    prefill_token_s=3e-5,
    decode_request_s=2e-4,
    context_token_s=1e-6,
)
COEFFICIENTS = (
    "base_s",
    "prefill_base_s",
    "prefill_token_s",
    "decode_request_s",
    "context_token_s",
)


def synthetic_samples(profile: LinearStepProfile, count: int = 60, seed: int = 0):
    """Step records of varied shapes timed exactly by `profile` (no noise)."""
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        prefill = rng.choice([0, 0, rng.randint(1, 2048)])
        decode = rng.randint(0 if prefill else 1, 32)
        context = decode * rng.randint(1, 600) if decode else 0
        samples.append((prefill, decode, context, profile.step_time(prefill, decode, context)))
        if i % 7 == 0:  # prefill-only steps pin prefill_base_s down
            samples.append((prefill + 1, 0, 0, profile.step_time(prefill + 1, 0, 0)))
    return samples


def test_fit_recovers_known_coefficients() -> None:
    fitted = fit_linear_profile(synthetic_samples(KNOWN), "fitted", swap_token_s=1e-7)
    for name in COEFFICIENTS:
        assert getattr(fitted, name) == pytest.approx(getattr(KNOWN, name), rel=1e-6), name
    assert fitted.swap_token_s == 1e-7
    # What `tokenfair profile --out` writes reads back as the same profile.
    assert profile_from_json(fitted.to_json()) == fitted


def test_fit_drops_a_term_the_data_says_is_negative() -> None:
    # Times that fall with context: a least-squares fit would price context negatively;
    # the non-negative fit sets that term to zero and refits the rest.
    samples = [(0, d, c, 0.01 + 0.001 * d - 1e-6 * c) for d in (1, 4, 8) for c in (100, 900)]
    fitted = fit_linear_profile(samples, "nonneg")
    assert fitted.context_token_s == 0.0
    assert all(getattr(fitted, name) >= 0 for name in COEFFICIENTS)
    assert fitted.decode_request_s > 0


def test_fit_leaves_unmeasured_terms_at_zero() -> None:
    # Decode-only records say nothing about prefill: those terms stay zero, not guessed.
    samples = [(0, d, 10 * d, KNOWN.step_time(0, d, 10 * d)) for d in range(1, 9)]
    fitted = fit_linear_profile(samples, "decode-only")
    assert fitted.prefill_token_s == 0.0 and fitted.prefill_base_s == 0.0


@pytest.mark.parametrize(("prompt", "output"), [(100, 1), (100, 50), (700, 9)])
def test_simulated_run_is_timed_by_the_fitted_profile(prompt: int, output: int) -> None:
    fitted = fit_linear_profile(synthetic_samples(KNOWN), "fitted")
    trace = [TraceRecord(2.0, "a", prompt, output, "r0")]
    config = SchedulerConfig(kv_tokens=4096, max_num_seqs=8, max_batched_tokens=1024)
    result = simulate(trace, make_policy("fcfs"), fitted, config)
    # One step prefills the prompt and yields the first token; each later token is a
    # decode step attending to the prompt and the tokens so far.
    expected = fitted.step_time(prompt, 0, 0) + sum(
        fitted.step_time(0, 1, prompt + k) for k in range(1, output)
    )
    record = result.results[0]
    assert result.steps == output
    assert record.output_tokens == output
    assert record.first_token_s == pytest.approx(2.0 + fitted.step_time(prompt, 0, 0), rel=1e-12)
    assert result.makespan_s == pytest.approx(expected, rel=1e-12)
    assert result.busy_s == pytest.approx(expected, rel=1e-12)


def test_simulated_batch_time_adds_up_step_by_step() -> None:
    # Two requests arriving together decode side by side: the makespan is the sum of
    # the profile's step times over the shapes the scheduler formed.
    fitted = fit_linear_profile(synthetic_samples(KNOWN), "fitted")
    trace = [TraceRecord(0.0, "a", 64, 5, "r0"), TraceRecord(0.0, "b", 32, 3, "r1")]
    config = SchedulerConfig(kv_tokens=4096, max_num_seqs=8, max_batched_tokens=1024)
    result = simulate(trace, make_policy("fcfs"), fitted, config)
    steps = [fitted.step_time(96, 0, 0)]  # both prompts in one step
    steps += [fitted.step_time(0, 2, (64 + k) + (32 + k)) for k in (1, 2)]
    steps += [fitted.step_time(0, 1, 64 + k) for k in (3, 4)]
    assert result.steps == len(steps)
    assert result.makespan_s == pytest.approx(sum(steps), rel=1e-12)


@pytest.mark.model
def test_real_step_records_describe_the_batches_run() -> None:
    pytest.importorskip("torch")
    from tokenfair.engine.hf.loader import load_model
    from tokenfair.engine.hf.profile import measure_steps

    batch_sizes, prompt_lengths, decode_steps = (1, 3), (16, 40), 4
    loaded = load_model("builtin:tiny", device="cpu")
    samples = measure_steps(loaded, batch_sizes, prompt_lengths, decode_steps)
    # Every measured workload (the warm-up's are dropped) prefills each prompt once and
    # decodes each request `decode_steps` times, whatever the machine's speed.
    assert sum(p for p, _, _, _ in samples) == sum(
        b * n for b in batch_sizes for n in prompt_lengths
    )
    assert sum(d for _, d, _, _ in samples) == decode_steps * sum(batch_sizes) * len(prompt_lengths)
    assert all(s > 0 for *_, s in samples)
    fitted = fit_linear_profile(samples, "tiny")
    assert all(getattr(fitted, name) >= 0 for name in COEFFICIENTS)
