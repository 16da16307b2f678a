"""The locality experiment: fair and cache-efficient at once, measured on the simulator.

Workloads whose clients share prompt prefixes (the `system-prompt` and `multiturn`
suites) run on the engine preset (vLLM-like: optimistic admission, chunked prefill,
prefix caching on) with a KV pool small enough that the clients' prefixes compete for
it, under FCFS, VTC and the locality-aware policies. Each run gives its throughput, the
share of prompt tokens served from the cache, Max Diff, the fluid fair-share ideal at
the run's own capacity (fairness/fluid.py), and the light clients' TTFT p90. Several
seeds of each suite are averaged: Max Diff in particular varies from draw to draw.

The pools: `system-prompt`'s clients have system prompts of 1,000-2,000 tokens and a
3,072-token pool holds one of them with its client's batch, not two; `multiturn`'s
conversations grow to 4,096 tokens and an 8,000-token pool holds a few of them.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.experiments.naming import check_policy_specs
from tokenfair.experiments.runner import (
    DEFAULT_PROFILE,
    DEFAULT_WORKERS,
    Job,
    ProgressFn,
    RunOutcome,
    run_jobs,
)
from tokenfair.experiments.summary import prefix_hit_rate
from tokenfair.experiments.workloads import suite_workload
from tokenfair.fairness.fluid import compare_with_fluid
from tokenfair.fairness.metrics import ttft_percentiles
from tokenfair.results import ResultRecord

# The engine the locality experiments (and the frontier, and the fluid ideal) run: the
# engine preset with prefix caching, and memory and step not shared among tenants, as
# their figures in docs/experiments.md and docs/fairness.md were measured. Sharing what
# a tenant holds keeps light tenants' prefixes in the pool too (on `system-prompt` with
# a 3,072-token pool and seed 1, vtc's hit rate goes from more than 0.1 below dlpm's
# to 0.920 against dlpm's 0.923);
# docs/fairness.md, "What a tenant holds".
LOCALITY_ENGINE_SETTINGS: dict[str, Any] = dict(
    enable_prefix_caching=True, share_memory=False, step_share_tokens=None
)

LOCALITY_POLICIES = ("fcfs", "vtc", "vtc-lpm", "dlpm")
# Suite -> KV pool in tokens (see the module docstring for why these).
LOCALITY_POOLS = {"system-prompt": 3072, "multiturn": 8000}
DEFAULT_SEEDS = (0, 1, 2)


@dataclass(frozen=True, slots=True)
class LocalityRow:
    """One policy on one suite, averaged over the seeds."""

    suite: str
    policy: str
    kv_tokens: int
    seeds: int
    throughput_tok_s: float
    prefix_hit_rate: float  # prompt tokens served from the cache / prompt tokens served
    max_diff: float
    fluid_max_diff: float  # the fair-share ideal's, at the run's own capacity
    fluid_shortfall: float  # service the clients were behind the ideal, at worst
    light_ttft_p90_s: float | None  # the clients sending fewer requests than average
    preemptions: float


@dataclass(slots=True)
class LocalityResult:
    rows: list[LocalityRow]
    outcomes: list[RunOutcome]
    out_dir: Path | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def row(self, suite: str, policy: str) -> LocalityRow:
        return next(r for r in self.rows if r.suite == suite and r.policy == policy)


def locality_jobs(
    seeds: Sequence[int] = DEFAULT_SEEDS,
    policies: Sequence[str] = LOCALITY_POLICIES,
    pools: dict[str, int] | None = None,
) -> list[Job]:
    jobs = []
    for suite, kv_tokens in (pools or LOCALITY_POOLS).items():
        config = SchedulerConfig(kv_tokens=kv_tokens, **LOCALITY_ENGINE_SETTINGS)
        for seed in seeds:
            workload = suite_workload(suite, seed)
            jobs += [Job(workload, p, config, variant=f"seed {seed}") for p in policies]
    return jobs


def is_locality_outcome(outcome: RunOutcome) -> bool:
    """A run of this experiment (in the paper experiment, beside the paper's runs)."""
    return outcome.workload.name in LOCALITY_POOLS


def light_clients(records: Sequence[ResultRecord]) -> set[str]:
    """Clients sending fewer requests than the average client."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r.client] = counts.get(r.client, 0) + 1
    average = len(records) / len(counts) if counts else 0.0
    return {c for c, n in counts.items() if n < average}


def light_ttft_p90(records: Sequence[ResultRecord]) -> float | None:
    light = light_clients(records)
    return ttft_percentiles([r for r in records if r.client in light])["*"]["p90"]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def locality_rows(outcomes: Sequence[RunOutcome]) -> list[LocalityRow]:
    groups: dict[tuple[str, str], list[RunOutcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.workload.name, outcome.policy), []).append(outcome)
    rows = []
    for (suite, policy), runs in groups.items():
        fluid = [
            compare_with_fluid(
                o.results,
                duration_s=o.workload.duration_s,
                window_s=o.workload.window_s,
                warmup_s=o.workload.warmup_s,
            )
            for o in runs
        ]
        rows.append(
            LocalityRow(
                suite=suite,
                policy=policy,
                kv_tokens=runs[0].job.config.kv_tokens,
                seeds=len(runs),
                throughput_tok_s=statistics.fmean(o.report.throughput_tok_s for o in runs),
                prefix_hit_rate=statistics.fmean(prefix_hit_rate(o.results) for o in runs),
                max_diff=statistics.fmean(o.report.max_diff for o in runs),
                fluid_max_diff=statistics.fmean(f.max_diff for f in fluid),
                fluid_shortfall=statistics.fmean(f.max_shortfall for f in fluid),
                light_ttft_p90_s=_mean([light_ttft_p90(o.results) for o in runs]),
                preemptions=statistics.fmean(o.preemptions for o in runs),
            )
        )
    return rows


def locality_settings(
    seeds: Sequence[int],
    policies: Sequence[str] = LOCALITY_POLICIES,
    pools: dict[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "profile": DEFAULT_PROFILE,
        "preset": "engine: optimistic admission, chunked prefill, prefix caching on",
        "kv_tokens": dict(pools or LOCALITY_POOLS),
        "seeds": list(seeds),
        "policies": list(policies),
    }


def run_locality_experiment(
    out_dir: Path | None = None,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    policies: Sequence[str] = LOCALITY_POLICIES,
    pools: dict[str, int] | None = None,
    workers: int = DEFAULT_WORKERS,
    progress: ProgressFn | None = None,
) -> LocalityResult:
    """Run the locality experiment; with `out_dir`, write metrics.json there."""
    check_policy_specs(policies, runner="the locality experiment")
    started = time.perf_counter()
    outcomes = run_jobs(locality_jobs(seeds, policies, pools), workers, progress)
    result = LocalityResult(
        rows=locality_rows(outcomes),
        outcomes=outcomes,
        out_dir=out_dir,
        settings=locality_settings(seeds, policies, pools),
    )
    result.wall_s = time.perf_counter() - started
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        metrics = {"settings": result.settings, "rows": [asdict(r) for r in result.rows]}
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return result
