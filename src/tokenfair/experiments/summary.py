"""One flat row of headline figures per run: what tables, JSON and the CLI print."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenfair.experiments.runner import RunOutcome


def summary_row(outcome: RunOutcome) -> dict[str, Any]:
    """The paper's table columns plus what explains them (rejections, preemptions, TTFT)."""
    report = outcome.report
    difference = report.accumulated_difference
    return {
        "workload": outcome.workload.name,
        "policy": outcome.policy,
        "variant": outcome.job.variant,
        "max_diff": report.max_diff,
        "avg_diff": report.avg_diff,
        "diff_var": report.diff_var,
        "throughput_tok_s": report.throughput_tok_s,
        "requests": report.num_requests,
        "served": report.num_served,
        "rejected": report.num_rejected,
        "preemptions": outcome.preemptions,
        "makespan_s": outcome.makespan_s,
        "ttft_p50_s": report.ttft_s.p50,
        "ttft_p90_s": report.ttft_s.p90,
        "ttft_p99_s": report.ttft_s.p99,
        "jain_per_tick_mean": report.jain_per_tick_mean,
        "backlogged": report.backlogged,
        "acc_diff_max": difference.peak,
        "acc_diff_final": difference.final,
        "acc_diff_scope": difference.scope,
        "sim_wall_s": outcome.wall_s,
    }


def find(outcomes: Sequence[RunOutcome], workload: str, policy: str) -> RunOutcome | None:
    """The outcome of `policy` on `workload` (its first, unvaried run), if there is one."""
    for outcome in outcomes:
        if outcome.workload.name == workload and outcome.policy == policy:
            return outcome
    return None


def ratio(value: float, reference: float) -> float | None:
    """value / reference, or None when the reference is zero."""
    return value / reference if reference else None
