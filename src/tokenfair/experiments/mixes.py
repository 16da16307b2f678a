"""Any mix of tenants: does a light tenant notice the heavy ones?

The promise: a tenant under its weighted share of every resource (seats, KV blocks, the
step's tokens) is not delayed by tenants over theirs, however many they are and
whatever they fill. The long-context-neighbour experiment (neighbor.py) checks it on
two hand-made cases; this one on a family of random mixes (workloads/mixes.py: 1-3
heavy tenants flooding long prompts beside 2-5 light chat tenants, weights 1-4 in half
of them), on the A10G and the H200 profiles, with the engine's default settings (the
profile's pool, prefix caching on) under:

- `vtc`: the default contention rules (memory and the step shared by weight);
- `fcfs, charges only` and `vtc, charges only`: memory and step not shared
  (`CHARGES_ONLY`, the engine as it ran before it shared what a tenant holds);
- each light tenant alone: its own requests, nobody else's (`vtc`, the defaults).

Weighted mixes tell `vtc` the weights (the registry's `wvtc`, the same policy given
weights). A light tenant's figures: its TTFT p99 and TPOT p50 under each run, and their
ratios to its alone figures. Its **demand as a share of its weighted share**:

    demand_i   = sum over its requests of w_in * input + w_out * output
                 (the paper's cost, w_in = 1, w_out = 2; every request of the trace:
                 they all arrive within the mix's span [0, T))
    capacity   = the service `fcfs, charges only` delivered to all tenants within
                 [0, T], each served request's cost spread uniformly over
                 [first token, finish] (tokenfair.fairness.spans, as the metrics do)
    share_i    = weight_i / (sum of all the mix's weights) * capacity
    demand_share_i = demand_i / share_i

Below 1 the tenant asks less than its weighted share of what the GPU served while the
heavy tenants kept it busy; those under 0.6 and under 0.9 are the summary's light
tenants. A mix's heavy throughput is the heavy tenants' tokens (prompt and output) over
the time from the first arrival to the last heavy finish.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenfair.core.cost import DEFAULT_COST, request_cost
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.experiments.neighbor import CHARGES_ONLY
from tokenfair.experiments.runner import Job, RunOutcome
from tokenfair.experiments.workloads import Workload
from tokenfair.fairness.curves import service_in_interval
from tokenfair.fairness.metrics import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S
from tokenfair.results import ResultRecord
from tokenfair.workloads.mixes import (
    HEAVY_PREFIX,
    LIGHT_PREFIX,
    PROFILES,
    Mix,
    mix_spec,
    random_mix,
)

DEFAULT = "vtc"
FCFS = "fcfs, charges only"
# (label, policy, settings over the engine's defaults)
RUNS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (DEFAULT, "vtc", {}),
    (FCFS, "fcfs", CHARGES_ONLY),
    ("vtc, charges only", "vtc", CHARGES_ONLY),
)
ALONE = "alone"
MIX_RUN_PREFIX = "mix:"  # its workloads' names
# Light tenants under these fractions of their weighted share (the summary's groups).
UNDER = (0.6, 0.9)
# A light tenant notices the heavy ones when its TTFT p99 passes this: on the A10G
# twice its alone figure, on the H200 (alone: tens of ms) half a second.
NOTICED: dict[str, tuple[str, float]] = {
    "a10g": ("ttft_p99_x_alone", 2.0),
    "h200": ("ttft_p99_s", 0.5),
}


def mix_workload(mix: Mix, tenant: str | None = None) -> Workload:
    """The mix as a workload; with `tenant`, that tenant's requests alone."""
    spec = mix.spec
    name = f"{MIX_RUN_PREFIX}{spec.profile}-{spec.seed}" + (f"-{tenant}" if tenant else "")
    return Workload(
        name=name,
        records=mix.alone(tenant) if tenant else mix.records,
        duration_s=spec.duration_s,
        description=spec.describe(),
        weights=mix.weights,
        # The runner's fairness report, on a mix cut short too (none of our figures).
        window_s=min(DEFAULT_WINDOW_S, spec.duration_s / 2),
        warmup_s=min(DEFAULT_WARMUP_S, spec.duration_s / 4),
    )


def mix_config(profile: str, settings: dict[str, Any]) -> SchedulerConfig:
    """The engine's defaults with the profile's pool and prefix caching (as vLLM's)."""
    pool = PROFILES[profile].kv_tokens
    return SchedulerConfig.from_dict({"kv_tokens": pool, "enable_prefix_caching": True, **settings})


def mix_jobs(
    seeds: Sequence[int],
    profiles: Sequence[str] = tuple(PROFILES),
    runs: Sequence[tuple[str, str, dict[str, Any]]] = RUNS,
    duration_s: float | None = None,
) -> list[Job]:
    """Every mix's runs, then each light tenant alone; the job's variant is
    `profile|seed|label` (alone: `profile|seed|alone|tenant`). `duration_s` cuts every
    mix to its first seconds of arrivals (for tests)."""
    jobs = []
    for profile in profiles:
        step_profile = PROFILES[profile].step_profile
        for seed in seeds:
            mix = random_mix(seed, profile)
            if duration_s is not None:
                mix = mix.until(duration_s)
            workload = mix_workload(mix)
            for label, policy, settings in runs:
                # Weighted VTC is VTC told the weights (the runner tells `wvtc` only).
                name = "wvtc" if policy == "vtc" and mix.weights else policy
                variant = f"{profile}|{seed}|{label}"
                jobs.append(
                    Job(workload, name, mix_config(profile, settings), step_profile, variant)
                )
            for tenant in mix.spec.light:
                if not mix.alone(tenant.name):
                    continue  # it sent nothing (a short cut of a mix): nothing to compare
                alone = mix_workload(mix, tenant.name)
                variant = f"{profile}|{seed}|{ALONE}|{tenant.name}"
                jobs.append(Job(alone, "vtc", mix_config(profile, {}), step_profile, variant))
    return jobs


@dataclass(frozen=True, slots=True)
class Latency:
    """One light tenant's figures under one run, and their ratios to it alone."""

    ttft_p99_s: float
    tpot_p50_s: float
    ttft_p99_x_alone: float | None = None
    tpot_p50_x_alone: float | None = None


@dataclass(frozen=True, slots=True)
class LightRow:
    """One light tenant of one mix: its demand against its weighted share, alone and
    under each run."""

    profile: str
    seed: int
    tenant: str
    weight: float
    demand: float  # w_in * input + w_out * output over its requests
    share: float  # weight / sum of weights x what fcfs served over the mix's span
    demand_share: float  # demand / share
    alone: Latency
    runs: dict[str, Latency] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MixRow:
    """One mix: what it is, and the heavy tenants' throughput under each run."""

    profile: str
    seed: int
    spec: str
    heavy_tok_s: dict[str, float]
    heavy_x_fcfs: dict[str, float]


def latencies(results: Sequence[ResultRecord], tenant: str) -> Latency:
    """`tenant`'s TTFT p99 and TPOT p50 (finish - first token over output - 1), in s."""
    mine = [r for r in results if r.client == tenant and r.first_token_s is not None]
    ttft = [r.first_token_s - r.arrival_s for r in mine]  # type: ignore[operator]
    tpot = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1)  # type: ignore[operator]
        for r in mine
        if r.output_tokens > 1 and r.finish_s is not None
    ]
    return Latency(
        ttft_p99_s=float(np.percentile(ttft, 99)) if ttft else 0.0,
        tpot_p50_s=float(np.percentile(tpot, 50)) if tpot else 0.0,
    )


def heavy_throughput(results: Sequence[ResultRecord]) -> float:
    """The heavy tenants' tokens over the time from the first arrival to their last finish."""
    heavy = [r for r in results if r.client.startswith(HEAVY_PREFIX) and r.finish_s is not None]
    if not heavy:
        return 0.0
    span = max(r.finish_s or 0.0 for r in heavy) - min(r.arrival_s for r in results)
    return sum(r.input_tokens + r.output_tokens for r in heavy) / span


def demand_shares(
    workload: Workload,
    fcfs_results: Sequence[ResultRecord],
    tenants: Sequence[str] | None = None,
) -> dict[str, tuple[float, float]]:
    """Every tenant's (demand, weighted share) over the workload's span [0, T]: the
    module docstring's definition. `tenants`: all the mix's tenants, whose weights
    divide the capacity (default: those with requests in the workload)."""
    served = sum(service_in_interval(fcfs_results, 0.0, workload.duration_s).values())
    weights = workload.weights or {}
    clients = list(dict.fromkeys([*(tenants or ()), *workload.clients]))
    total_weight = sum(weights.get(c, 1.0) for c in clients)
    demand = dict.fromkeys(clients, 0.0)
    for r in workload.records:
        demand[r.client] += request_cost(DEFAULT_COST, r.input_tokens, r.output_tokens)
    return {c: (demand[c], weights.get(c, 1.0) / total_weight * served) for c in clients}


def _ratio(value: float, base: float) -> float | None:
    return value / base if base > 0 else None


def mix_rows(outcomes: Sequence[RunOutcome]) -> tuple[list[LightRow], list[MixRow]]:
    """The light tenants' rows and the mixes' rows, in the order the mixes ran."""
    by_mix: dict[tuple[str, int], dict[str, RunOutcome]] = {}
    for outcome in outcomes:
        profile, seed_text, label = outcome.job.variant.split("|", 2)
        by_mix.setdefault((profile, int(seed_text)), {})[label] = outcome
    lights: list[LightRow] = []
    mixes: list[MixRow] = []
    for (profile, seed), runs in by_mix.items():
        fcfs = runs[FCFS]
        tenants = [t.name for t in mix_spec(seed, profile).tenants]
        shares = demand_shares(fcfs.workload, fcfs.results, tenants)
        labels = [label for label in runs if not label.startswith(ALONE)]
        tok_s = {label: heavy_throughput(runs[label].results) for label in labels}
        mixes.append(
            MixRow(
                profile,
                seed,
                fcfs.workload.description,
                tok_s,
                {label: tok_s[label] / tok_s[FCFS] for label in labels if tok_s[FCFS]},
            )
        )
        weights = fcfs.workload.weights or {}
        for tenant in (c for c in tenants if c.startswith(LIGHT_PREFIX)):
            if f"{ALONE}|{tenant}" not in runs:
                continue  # no requests
            alone = latencies(runs[f"{ALONE}|{tenant}"].results, tenant)
            figures = {}
            for label in labels:
                mine = latencies(runs[label].results, tenant)
                figures[label] = Latency(
                    mine.ttft_p99_s,
                    mine.tpot_p50_s,
                    _ratio(mine.ttft_p99_s, alone.ttft_p99_s),
                    _ratio(mine.tpot_p50_s, alone.tpot_p50_s),
                )
            demand, share = shares[tenant]
            lights.append(
                LightRow(
                    profile,
                    seed,
                    tenant,
                    weights.get(tenant, 1.0),
                    demand,
                    share,
                    demand / share if share > 0 else float("inf"),
                    alone,
                    figures,
                )
            )
    return lights, mixes


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summary(lights: Sequence[LightRow], mixes: Sequence[MixRow]) -> dict[str, Any]:
    """Per profile and run: the light tenants' TTFT p99 ratio to alone (median and
    worst) for those under 60% and under 90% of their share, how many of those under
    90% notice the heavy tenants (NOTICED), and the worst heavy throughput ÷ fcfs."""
    out: dict[str, Any] = {}
    for profile in dict.fromkeys(row.profile for row in mixes):
        mine = [row for row in lights if row.profile == profile]
        key, limit = NOTICED.get(profile, NOTICED["a10g"])
        per_run: dict[str, Any] = {}
        for label in dict.fromkeys(label for row in mine for label in row.runs):
            figures: dict[str, Any] = {}
            for under in UNDER:
                ratios = [
                    r.runs[label].ttft_p99_x_alone or 0.0 for r in mine if r.demand_share < under
                ]
                figures[f"under_{round(under * 100)}"] = {
                    "tenants": len(ratios),
                    "ttft_p99_x_alone_median": _median(ratios),
                    "ttft_p99_x_alone_worst": max(ratios, default=None),
                }
            light = [r for r in mine if r.demand_share < UNDER[-1]]
            figures["noticed"] = {
                "rule": f"{key} > {limit:g}",
                "of_under_90": sum((getattr(r.runs[label], key) or 0.0) > limit for r in light),
                "of_all": sum((getattr(r.runs[label], key) or 0.0) > limit for r in mine),
                "light_tenants": len(mine),
            }
            ratios = [row.heavy_x_fcfs[label] for row in mixes if row.profile == profile]
            figures["heavy_x_fcfs_worst"] = min(ratios, default=None)
            per_run[label] = figures
        out[profile] = {"mixes": sum(row.profile == profile for row in mixes), "runs": per_run}
    return out
