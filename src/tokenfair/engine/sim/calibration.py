"""Calibrate a fitted step-time profile on a measured run: one additive per-step overhead.

The A10G profile is fitted to the paper authors' timings of homogeneous batches
(engine/sim/profile.py). The real router also spends time the grid does not show
(Python work per step, ragged batches), and the measured FCFS run tells how much:
between a request's first token and its finish, the real server ran some number of
steps, and the request's decode window (latency - TTFT, both measured) is their total
time. For a per-step overhead `d`, each simulated window grows by d x (the steps it
spans), so `d` is fitted by least squares on

    measured window_i - simulated window_i = d x steps_i

over every request with a window. Since the overhead changes queueing, and so which
steps each window spans, the fit is repeated against a re-simulation until it settles
(a fixed point, damped by half after the first step). Only decode windows are used:
TTFT is queueing-dominated, so it is kept for validation.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.executor import StepRecord
from tokenfair.engine.sim.profile import LinearStepProfile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.results import ResultRecord
from tokenfair.workloads.trace import TraceRecord


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    profile: LinearStepProfile  # the input profile with its fitted step_overhead_s
    overhead_s: float
    iterations: list[float]  # overhead after each fit
    windows: int  # requests whose decode window was fitted
    rms_residual_s: float  # of the windows, at the last simulation


def steps_in_windows(
    results: Sequence[ResultRecord], step_log: Sequence[StepRecord]
) -> list[int | None]:
    """How many steps ended in each request's (first token, finish] window (None: unserved)."""
    ends = [step.end_s for step in step_log]
    counts: list[int | None] = []
    for record in results:
        if record.first_token_s is None or record.finish_s is None:
            counts.append(None)
            continue
        # Times are sums of the same floats: a step ends exactly at the token it made.
        first = bisect.bisect_right(ends, record.first_token_s)
        last = bisect.bisect_right(ends, record.finish_s)
        counts.append(last - first)
    return counts


def _window(record: ResultRecord) -> float | None:
    if record.first_token_s is None or record.finish_s is None:
        return None
    return record.finish_s - record.first_token_s


def _overhead_step(
    simulated: Sequence[ResultRecord],
    measured: Sequence[ResultRecord],
    steps: Sequence[int | None],
) -> tuple[float, int, float]:
    """Least-squares overhead change for the windows, their count and RMS residual."""
    residuals, counts = [], []
    for sim, real, n in zip(simulated, measured, steps, strict=True):
        sim_window, real_window = _window(sim), _window(real)
        if n and sim_window is not None and real_window is not None:
            residuals.append(real_window - sim_window)
            counts.append(n)
    if not counts:
        raise ValueError("no request has a decode window to calibrate on")
    residual, spanned = np.array(residuals), np.array(counts, dtype=float)
    change = float(residual @ spanned / (spanned @ spanned))
    return change, len(counts), float(np.sqrt(np.mean(residual**2)))


def calibrate_step_overhead(
    trace: Sequence[TraceRecord],
    measured: Sequence[ResultRecord],
    profile: LinearStepProfile,
    config: SchedulerConfig,
    max_iterations: int = 12,
    tolerance_s: float = 1e-6,
) -> CalibrationResult:
    """Fit `profile.step_overhead_s` to a measured FCFS run of `trace` (same order)."""
    if len(trace) != len(measured):
        raise ValueError(f"{len(trace)} trace requests vs {len(measured)} measured")
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
    measured_in_order = [measured[i] for i in order]
    overhead = profile.step_overhead_s
    history: list[float] = []
    windows, rms = 0, 0.0
    for iteration in range(max_iterations):
        candidate = dataclasses.replace(profile, step_overhead_s=overhead)
        step_log: list[StepRecord] = []
        run = simulate(trace, FCFSPolicy(), candidate, config, step_log)
        steps = steps_in_windows(run.results, step_log)
        change, windows, rms = _overhead_step(run.results, measured_in_order, steps)
        overhead += change if iteration == 0 else change / 2
        history.append(overhead)
        if abs(change) < tolerance_s:
            break
    return CalibrationResult(
        dataclasses.replace(profile, step_overhead_s=overhead), overhead, history, windows, rms
    )
