"""The simulator: the A10G profile against the paper's measured run, and trace replay."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import (
    LinearStepProfile,
    fit_linear_profile,
    load_profile,
    samples_from_cost_profile,
)
from tokenfair.engine.sim.simulator import simulate
from tokenfair.engine.sim.validation import compare_with_measured
from tokenfair.measured import read_measured_reference
from tokenfair.workloads.trace import TraceRecord, read_trace

MEASURED_MAKESPAN_S = 757.7
MEASURED_THROUGHPUT = 777.0


def throughput(result) -> float:
    served = [r for r in result.results if r.finish_s is not None]
    return sum(r.input_tokens + r.output_tokens for r in served) / result.makespan_s


@pytest.fixture(scope="module")
def arena(shared_dir):
    return read_trace(shared_dir / "traces" / "arena_vtc_600s.jsonl")


@pytest.fixture(scope="module")
def fcfs_arena(arena):
    return simulate(
        arena, make_policy("fcfs"), load_profile("a10g-llama-7b"), SchedulerConfig.paper()
    )


def test_shipped_a10g_profile_is_the_fit_of_the_papers_timings(shared_dir):
    import json

    grid = json.loads((shared_dir / "reference" / "a10g_llama7b_cost_profile.json").read_text())
    refit = fit_linear_profile(samples_from_cost_profile(grid), "refit")
    shipped = load_profile("a10g-llama-7b")
    assert isinstance(shipped, LinearStepProfile)
    for field in (
        "base_s",
        "prefill_base_s",
        "prefill_token_s",
        "decode_request_s",
        "context_token_s",
    ):
        assert getattr(shipped, field) == pytest.approx(getattr(refit, field), rel=1e-6)
    # One decode step at batch 37 of 8-token prompts and 256 outputs: ~36 ms measured.
    assert shipped.step_time(0, 37, 37 * (8 + 128)) == pytest.approx(0.0364, rel=0.05)


def test_fcfs_arena_replay_matches_the_measured_a10g_run(fcfs_arena, shared_dir):
    measured = read_measured_reference(
        shared_dir / "reference" / "a10g_llama7b_fcfs_arena_measured.jsonl"
    )
    report = compare_with_measured(fcfs_arena.results, measured, MEASURED_MAKESPAN_S)
    # The figures the calibrated profile reaches (docs/simulator.md), with some margin.
    assert abs(report["makespan_error"]) <= 0.03, report
    assert throughput(fcfs_arena) == pytest.approx(MEASURED_THROUGHPUT, rel=0.03)
    assert all(r.finish_reason == "stop" for r in fcfs_arena.results)
    assert fcfs_arena.preemptions == 0  # reserve admission never preempts
    assert report["unmatched_requests"] == 0
    median_ttft = report["measured_ttft_median_s"]
    assert report["ttft_abs_error_median_s"] < 0.15 * median_ttft, report
    assert report["latency_abs_error_median_s"] < 0.15 * report["measured_latency_median_s"]


def test_vtc_keeps_fcfs_throughput_on_the_arena(arena, fcfs_arena):
    vtc = simulate(
        arena, make_policy("vtc"), load_profile("a10g-llama-7b"), SchedulerConfig.paper()
    )
    assert throughput(vtc) == pytest.approx(throughput(fcfs_arena), rel=0.01)


def test_simulation_is_deterministic(arena):
    def run():
        return simulate(
            arena[:200], make_policy("vtc"), load_profile("a10g-llama-7b"), SchedulerConfig.paper()
        )

    assert run().results == run().results


def test_cancel_after_aborts_a_request_wherever_it_is():
    trace = [
        TraceRecord(
            arrival_s=0.0,
            client="a",
            input_tokens=10,
            output_tokens=2000,
            request_id="long",
            cancel_after_s=5.0,
        ),
        TraceRecord(
            arrival_s=0.0, client="b", input_tokens=10, output_tokens=100, request_id="short"
        ),
        TraceRecord(
            arrival_s=0.1,
            client="c",
            input_tokens=2000,
            output_tokens=100,
            request_id="queued",
            cancel_after_s=0.5,
        ),
    ]
    config = SchedulerConfig(kv_tokens=2200, block_size=16, max_num_seqs=2)
    result = simulate(trace, make_policy("fcfs"), load_profile("a10g-llama-7b"), config)
    by_id = {r.request_id: r for r in result.results}
    assert by_id["long"].finish_reason == "abort"
    assert 5.0 <= by_id["long"].finish_s < 5.2  # at the first step boundary after 5 s
    assert 0 < by_id["long"].output_tokens < 2000
    assert by_id["queued"].finish_reason == "abort" and by_id["queued"].first_token_s is None
    assert by_id["short"].finish_reason == "stop" and by_id["short"].output_tokens == 100


def test_engine_preset_with_swap_and_roofline_profile_runs_the_arena(arena):
    # Arrivals 20x denser than the trace, into a small pool: the H200 must preempt.
    burst = [replace(r, arrival_s=r.arrival_s / 20) for r in arena[:400]]
    config = SchedulerConfig(kv_tokens=3000, swap_tokens=1000, preemption="swap")
    result = simulate(burst, make_policy("vtc"), load_profile("h200-llama-3-8b"), config)
    assert all(r.finish_reason == "stop" for r in result.results)
    assert result.preemptions > 0 and result.swaps > 0
    assert {r.output_tokens for r in result.results} == {r.output_tokens for r in arena[:400]}


def test_roofline_profile_is_memory_bound_in_decode_and_compute_bound_in_prefill():
    h200 = load_profile("h200-llama-3-8b")
    # Batch-1 decode at 1,000 context tokens: weights + KV over 80% of 4.8 TB/s, + 3 ms.
    expected = 0.003 + (16.06e9 + 131072 * 1001) / (4.8e12 * 0.8)
    assert h200.step_time(0, 1, 1000) == pytest.approx(expected)
    # An 8k-token prefill: 2 x params FLOPs per token over 60% of 989 TFLOP/s, + 3 ms.
    assert h200.step_time(8192, 0, 0) == pytest.approx(0.003 + 2 * 8.03e9 * 8192 / (989e12 * 0.6))
    assert h200.step_time(0, 128, 128_000) > h200.step_time(0, 1, 1000)


def test_profile_fit_drops_a_negative_term_and_refits_the_rest():
    # Times that fall with context tokens cannot mean negative seconds per token:
    # the context term is dropped and the others refitted without it.
    samples = [(0, d, c, 0.010 + 0.001 * d - 1e-7 * c) for d in (1, 8, 32) for c in (100, 5000)]
    samples += [(p, 0, 0, 0.010 + 0.02 + 0.0002 * p) for p in (64, 512, 2048)]
    fitted = fit_linear_profile(samples, "test")
    assert fitted.context_token_s == 0.0
    assert (
        min(fitted.base_s, fitted.prefill_base_s, fitted.prefill_token_s, fitted.decode_request_s)
        >= 0
    )
    assert fitted.prefill_token_s == pytest.approx(0.0002, rel=0.05)
    assert fitted.decode_request_s == pytest.approx(0.001, rel=0.2)
