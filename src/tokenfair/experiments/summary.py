"""One flat row of headline figures per run: what tables, metrics.json and the CLI print."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tokenfair.experiments.runner import RunOutcome
from tokenfair.results import ResultRecord


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The paper's table columns plus what explains them (rejections, preemptions, TTFT)."""

    workload: str
    policy: str  # the spec as given
    label: str  # what reports call it (`policy_label`)
    variant: str
    max_diff: float
    avg_diff: float
    diff_var: float
    throughput_tok_s: float
    requests: int
    served: int
    rejected: int
    preemptions: int
    makespan_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    jain_per_tick_mean: float | None
    backlogged: list[str]
    acc_diff_max: float
    acc_diff_final: float
    acc_diff_scope: str
    sim_wall_s: float
    # With prefix caching on (None when off): prompt tokens served from the cache over
    # prompt tokens served, and each client's prompt tokens served from the cache.
    prefix_hit_rate: float | None = None
    cached_tokens: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summary_row(outcome: RunOutcome) -> RunSummary:
    report = outcome.report
    difference = report.accumulated_difference
    return RunSummary(
        workload=outcome.workload.name,
        policy=outcome.policy,
        label=outcome.label,
        variant=outcome.job.variant,
        max_diff=report.max_diff,
        avg_diff=report.avg_diff,
        diff_var=report.diff_var,
        throughput_tok_s=report.throughput_tok_s,
        requests=report.num_requests,
        served=report.num_served,
        rejected=report.num_rejected,
        preemptions=outcome.preemptions,
        makespan_s=outcome.makespan_s,
        ttft_p50_s=report.ttft_s.p50,
        ttft_p90_s=report.ttft_s.p90,
        ttft_p99_s=report.ttft_s.p99,
        jain_per_tick_mean=report.jain_per_tick_mean,
        backlogged=list(report.backlogged),
        acc_diff_max=difference.peak,
        acc_diff_final=difference.final,
        acc_diff_scope=difference.scope,
        sim_wall_s=outcome.wall_s,
        **_prefix_cache_fields(outcome),
    )


def prefix_hit_rate(records: Sequence[ResultRecord]) -> float:
    """Prompt tokens served from the prefix cache over prompt tokens served."""
    served = [r for r in records if r.served]
    prompts = sum(r.input_tokens for r in served)
    return sum(r.cached_tokens for r in served) / prompts if prompts else 0.0


def cached_tokens_by_client(records: Sequence[ResultRecord]) -> dict[str, int]:
    """Each client's prompt tokens served from the prefix cache, clients in name order."""
    cached = dict.fromkeys(sorted({r.client for r in records}), 0)
    for r in records:
        if r.served:
            cached[r.client] += r.cached_tokens
    return cached


def _prefix_cache_fields(outcome: RunOutcome) -> dict[str, Any]:
    if not outcome.job.config.enable_prefix_caching:
        return {}
    return {
        "prefix_hit_rate": prefix_hit_rate(outcome.results),
        "cached_tokens": cached_tokens_by_client(outcome.results),
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
