"""The A10G simulator against what was measured: calibration data and held-out data.

Calibration data (shared/reference/): the measured FCFS run of the arena trace. The
shipped `a10g-llama-7b` profile's per-step overhead was fitted to that run's decode
windows (docs/simulator.md); this benchmark checks the fit is still a fixed point
(`calibration`), then compares the FCFS replay with the run: makespan (757.7 s),
throughput, and the median and p90 of the absolute and relative per-request TTFT and
latency errors (`fcfs_vs_measured`).

Held-out data (SPEC section 7): the paper's table of eight schedulers on the same trace,
never used to fit anything. For each policy: simulated vs measured throughput and Max
Diff (`held_out`). The paper's VTC row was measured with the artifact's queue, so it is
compared with both `vtc` (the paper's algorithm) and `vtc-artifact` (the artifact's
queue exactly).

How far one run's Max Diff can be trusted (`max_diff_spread`): the same simulation
with every arrival moved by a uniform +-1 ms (client-side timing noise far below what
a real benchmark client has), over `--jitter-seeds` seeds. Prints one JSON line.

    python benchmarks/validate_a10g.py [--shared ../shared] [--workers 2] [--jitter-seeds 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.calibration import calibrate_step_overhead
from tokenfair.engine.sim.profile import LinearStepProfile, load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.engine.sim.validation import compare_with_measured
from tokenfair.experiments.paper_table import PAPER_ARENA_TABLE
from tokenfair.fairness.metrics import throughput
from tokenfair.fairness.report import fairness_report
from tokenfair.measured import read_measured_reference
from tokenfair.workloads.trace import read_trace

MEASURED_MAKESPAN_S = 757.7
PAPER_DURATION_S = 600.0  # SPEC section 6: T for the 10-minute trace
# Simulated policy -> the paper's row it is compared with.
HELD_OUT = {name: name for name in PAPER_ARENA_TABLE} | {"vtc-artifact": "vtc"}


def _simulate_policy(args: tuple[Path, str]) -> dict[str, Any]:
    trace_path, policy = args
    trace = read_trace(trace_path)
    run = simulate(
        trace, make_policy(policy), load_profile("a10g-llama-7b"), SchedulerConfig.paper()
    )
    report = fairness_report(run.results, duration_s=PAPER_DURATION_S)
    paper = PAPER_ARENA_TABLE[HELD_OUT[policy]]
    tput = throughput(run.results)
    return {
        "policy": policy,
        "paper_row": paper.scheduler,
        "throughput_tok_s": round(tput, 1),
        "paper_throughput_tok_s": paper.throughput_tok_s,
        "throughput_error": round(tput / paper.throughput_tok_s - 1, 4),
        "max_diff": round(report.max_diff, 2),
        "paper_max_diff": paper.max_diff,
        "max_diff_error": round(report.max_diff / paper.max_diff - 1, 4),
        "avg_diff": round(report.avg_diff, 2),
        "paper_avg_diff": paper.avg_diff,
        "makespan_s": round(run.makespan_s, 1),
    }


def _jittered_max_diff(args: tuple[Path, str, int]) -> float:
    trace_path, policy, seed = args
    rng = random.Random(seed)
    trace = [
        dataclasses.replace(r, arrival_s=max(0.0, r.arrival_s + rng.uniform(-1e-3, 1e-3)))
        for r in read_trace(trace_path)
    ]
    run = simulate(
        trace, make_policy(policy), load_profile("a10g-llama-7b"), SchedulerConfig.paper()
    )
    return fairness_report(run.results, duration_s=PAPER_DURATION_S).max_diff


def _spread(values: list[float], paper: float) -> dict[str, Any]:
    ordered = sorted(values)
    median = (
        ordered[len(ordered) // 2]
        if len(ordered) % 2
        else sum(ordered[len(ordered) // 2 - 1 : len(ordered) // 2 + 1]) / 2
    )
    return {
        "runs": len(ordered),
        "min": round(ordered[0], 2),
        "median": round(median, 2),
        "max": round(ordered[-1], 2),
        "paper": paper,
        "paper_within_range": ordered[0] <= paper <= ordered[-1],
        "median_error": round(median / paper - 1, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jitter-seeds", type=int, default=10)
    args = parser.parse_args()
    trace_path = args.shared / "traces" / "arena_vtc_600s.jsonl"
    trace = read_trace(trace_path)
    measured = read_measured_reference(
        args.shared / "reference" / "a10g_llama7b_fcfs_arena_measured.jsonl"
    )
    profile = load_profile("a10g-llama-7b")
    assert isinstance(profile, LinearStepProfile)
    figures: dict[str, Any] = {"benchmark": "validate_a10g"}

    # One more fit from the shipped overhead: a fixed point moves by (almost) nothing.
    check = calibrate_step_overhead(
        trace, measured, profile, SchedulerConfig.paper(), max_iterations=1
    )
    figures["calibration"] = {
        "shipped_step_overhead_ms": round(profile.step_overhead_s * 1e3, 4),
        "refit_step_overhead_ms": round(check.overhead_s * 1e3, 4),
        "windows": check.windows,
        "window_rms_residual_s": round(check.rms_residual_s, 3),
    }

    spread_policies = ("vtc-artifact", "vtc", "fcfs")
    jitter_jobs = [
        (trace_path, p, seed) for p in spread_policies for seed in range(args.jitter_seeds)
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        rows = list(pool.map(_simulate_policy, [(trace_path, p) for p in HELD_OUT]))
        jittered = list(pool.map(_jittered_max_diff, jitter_jobs))
    fcfs = simulate(trace, make_policy("fcfs"), profile, SchedulerConfig.paper())
    report = compare_with_measured(fcfs.results, measured, MEASURED_MAKESPAN_S)
    fcfs_vs_measured = {k: round(v, 4) for k, v in report.items()}
    measured_tput = throughput(measured)
    fcfs_vs_measured["throughput_tok_s"] = round(throughput(fcfs.results), 1)
    fcfs_vs_measured["measured_throughput_tok_s"] = round(measured_tput, 1)
    fcfs_vs_measured["ttft_abs_error_median_over_measured_median"] = round(
        report["ttft_abs_error_median_s"] / report["measured_ttft_median_s"], 4
    )
    figures["fcfs_vs_measured"] = fcfs_vs_measured

    by_policy = {row["policy"]: row for row in rows}
    figures["held_out"] = rows
    figures["held_out_summary"] = {
        "worst_throughput_error": max(abs(r["throughput_error"]) for r in rows),
        "vtc_below_fcfs_max_diff": by_policy["vtc"]["max_diff"] < by_policy["fcfs"]["max_diff"],
        "vtc_artifact_below_fcfs_max_diff": by_policy["vtc-artifact"]["max_diff"]
        < by_policy["fcfs"]["max_diff"],
        "vtc_artifact_max_diff_error": by_policy["vtc-artifact"]["max_diff_error"],
    }
    if args.jitter_seeds:
        figures["max_diff_spread"] = {
            policy: _spread(
                [m for (_, p, _), m in zip(jitter_jobs, jittered, strict=True) if p == policy],
                PAPER_ARENA_TABLE[HELD_OUT[policy]].max_diff,
            )
            for policy in spread_policies
        }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
