"""The per-step overhead calibration, and the per-request comparison with a measured run."""

from __future__ import annotations

import dataclasses

import pytest

from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.calibration import calibrate_step_overhead, steps_in_windows
from tokenfair.engine.sim.executor import StepRecord
from tokenfair.engine.sim.profile import LinearStepProfile, load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.engine.sim.validation import compare_with_measured
from tokenfair.measured import read_measured_reference
from tokenfair.results import ResultRecord
from tokenfair.workloads.trace import read_trace


def record(arrival, first, finish, request_id="r"):
    return ResultRecord(
        request_id=request_id,
        client="a",
        arrival_s=arrival,
        input_tokens=4,
        output_tokens=3,
        first_token_s=first,
        finish_s=finish,
        status="finished",
        finish_reason="stop" if first is not None else "rejected",
    )


def test_steps_in_a_window_are_those_ending_after_the_first_token_up_to_the_finish():
    log = [StepRecord(t, t + 1.0, 0, 1, 1) for t in range(6)]  # steps end at 1..6
    results = [record(0.0, 2.0, 5.0), record(0.0, None, None)]
    assert steps_in_windows(results, log) == [3, None]  # the steps ending at 3, 4, 5


def test_calibration_recovers_a_known_overhead(shared_dir):
    # A "measured" run made by the simulator itself with a 3 ms overhead per step:
    # starting from none, the fit must find it again.
    trace = read_trace(shared_dir / "traces" / "arena_vtc_600s.jsonl")[:300]
    base = load_profile("a10g-llama-7b")
    assert isinstance(base, LinearStepProfile)
    truth = dataclasses.replace(base, step_overhead_s=0.003)
    config = SchedulerConfig.paper()
    measured = simulate(trace, make_policy("fcfs"), truth, config).results
    start = dataclasses.replace(base, step_overhead_s=0.0)
    fitted = calibrate_step_overhead(trace, measured, start, config)
    assert fitted.overhead_s == pytest.approx(0.003, rel=0.02)
    assert fitted.profile.step_overhead_s == fitted.overhead_s
    assert fitted.rms_residual_s < 0.05


@pytest.mark.slow
def test_the_shipped_overhead_is_the_calibration_on_the_measured_run(shared_dir):
    trace = read_trace(shared_dir / "traces" / "arena_vtc_600s.jsonl")
    measured = read_measured_reference(
        shared_dir / "reference" / "a10g_llama7b_fcfs_arena_measured.jsonl"
    )
    shipped = load_profile("a10g-llama-7b")
    assert isinstance(shipped, LinearStepProfile) and shipped.step_overhead_s > 0
    refit = calibrate_step_overhead(
        trace, measured, shipped, SchedulerConfig.paper(), max_iterations=1
    )
    # A fixed point: one more fit moves it by under 1% (0.02 ms).
    assert refit.overhead_s == pytest.approx(shipped.step_overhead_s, rel=0.01)


def test_validation_leaves_out_requests_that_either_side_never_served():
    simulated = [record(0.0, 1.0, 3.0), record(1.0, 3.0, 5.0), record(2.0, 4.0, 8.0)]
    measured = [record(0.0, 2.0, 4.0), record(1.0, None, None), record(2.0, 4.0, 6.0)]
    report = compare_with_measured(simulated, measured, measured_makespan_s=8.0)
    assert report["matched_requests"] == 2 and report["unmatched_requests"] == 1
    # TTFT errors: |1 - 2| = 1 (relative 1/2) and |2 - 2| = 0.
    assert report["ttft_abs_error_median_s"] == pytest.approx(0.5)
    assert report["ttft_rel_error_median"] == pytest.approx(0.25)
    # Latency errors: |3 - 4| = 1 (1/4) and |6 - 4| = 2 (2/4).
    assert report["latency_abs_error_median_s"] == pytest.approx(1.5)
    assert report["latency_rel_error_p90"] == pytest.approx(0.25 + 0.9 * 0.25)
    assert report["makespan_error"] == pytest.approx(0.0)
