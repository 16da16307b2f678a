"""The fairness-efficiency frontier with prefix caching, measured on the simulator.

Retrieval-style work (the `documents` workload: six backlogged clients, each asking
about four 2,500-token documents of its own, client-0 2.5x busier) on the engine preset
with prefix caching and the `a10g-llama-7b` profile. When the KV pool cannot hold every
document, which client goes next decides the hit rate: a policy that keeps serving the
client whose document is cached gains throughput and gives up fairness. The sweep
places each policy on that trade-off for every (pool, workload variant):

- pools: fractions of the documents' footprint (the tokens of every distinct document);
- variants: popularity skew across a client's documents (0: uniform, 1: Zipf), and
  documents shared by every client (one prefix group across clients);
- controls, where the cache has nothing to give: a pool holding every document (1.5x
  the footprint, room for the batch besides), and the `system-prompt` suite with a pool
  holding every client's system prompt likewise.

Metrics, per run (SPEC section 6): T = the workload's duration (300 s), w = 60 s,
warm-up 30 s. The clients stay backlogged to T and far beyond (the simulation drains
the queues), so throughput is measured over the same interval as fairness, [warm-up,
T]: the input + output tokens served in it (each request's spread over its first token
to its finish, as service is) divided by T - warm-up. SPEC's throughput (first arrival
to last finish, mostly the drain, when fewer and fewer clients are left) is kept beside
it. Each figure is the mean over seeds; every ratio is to VTC's in the same (pool,
variant), computed from the means.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from tokenfair.core.cost import LinearCost
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.experiments.locality import LOCALITY_ENGINE_SETTINGS, prefix_hit_rate
from tokenfair.experiments.runner import (
    DEFAULT_PROFILE,
    DEFAULT_WORKERS,
    Job,
    ProgressFn,
    RunOutcome,
    run_jobs,
)
from tokenfair.experiments.workloads import Workload, suite_workload
from tokenfair.fairness.spans import service_spans
from tokenfair.results import ResultRecord
from tokenfair.workloads.documents import DocumentsSpec
from tokenfair.workloads.suites import documents_workload

FRONTIER_POLICIES = (
    "fcfs",
    "vtc",
    "vtc-lpm",
    "vtc-hit",
    "dlpm:2048",
    "dlpm",
    "dlpm:8192",
    "dlpm:32768",
    "dlpm:1e12",
)
FRONTIER_POOLS = (0.2, 0.3, 0.5)  # fractions of the documents' footprint
FRONTIER_SKEWS = (0.0, 1.0)
# The shared variant: this many of each client's four documents are the same for every
# client (the most popular ones), at skew 0; 0 leaves the variant out.
FRONTIER_SHARED = 2
CONTROL_POOL = 1.5  # every prefix fits, with room for the running batch
DEFAULT_SEEDS = (0, 1, 2)
TOKENS = LinearCost(1.0, 1.0)  # throughput counts input + output tokens


@dataclass(frozen=True, slots=True)
class Scenario:
    """One (workload variant, pool) of the sweep."""

    variant: str  # e.g. "skew 0", "skew 1", "skew 0, 2 shared", "control: system-prompt"
    pool_fraction: float  # of the footprint: the tokens of every distinct prefix
    spec: DocumentsSpec | None  # None: the system-prompt suite
    control: bool = False

    def workload(self, seed: int) -> Workload:
        if self.spec is None:
            return suite_workload("system-prompt", seed)
        suite = documents_workload(self.spec, seed)
        return Workload(
            name="documents",
            records=tuple(suite.records),
            duration_s=suite.duration_s,
            description=self.spec.describe(),
        )

    def kv_tokens(self, workload: Workload) -> int:
        return max(16, round(self.pool_fraction * footprint_tokens(workload)))


def footprint_tokens(workload: Workload) -> int:
    """Tokens of every distinct prefix the workload's requests read."""
    longest: dict[str, int] = {}
    for r in workload.records:
        if r.prefix_group is not None and r.prefix_tokens is not None:
            longest[r.prefix_group] = max(longest.get(r.prefix_group, 0), r.prefix_tokens)
    return sum(longest.values())


def variant_name(skew: float, shared: int = 0) -> str:
    return f"skew {skew:g}" + (f", {shared} shared" if shared else "")


def frontier_scenarios(
    pools: Sequence[float] = FRONTIER_POOLS,
    skews: Sequence[float] = FRONTIER_SKEWS,
    shared: int = FRONTIER_SHARED,
    controls: bool = True,
    base: DocumentsSpec | None = None,
) -> list[Scenario]:
    base = base or DocumentsSpec()
    specs = [(variant_name(s), replace(base, skew=s)) for s in skews]
    if shared:
        specs.append((variant_name(0.0, shared), replace(base, skew=0.0, shared_documents=shared)))
    scenarios = [Scenario(name, pool, spec) for pool in pools for name, spec in specs]
    if controls:
        scenarios.append(
            Scenario("control: documents", CONTROL_POOL, replace(base, skew=0.0), control=True)
        )
        scenarios.append(Scenario("control: system-prompt", CONTROL_POOL, None, control=True))
    return scenarios


@dataclass(frozen=True, slots=True)
class FrontierCell:
    """One policy in one (variant, pool), averaged over the seeds."""

    variant: str
    pool_fraction: float
    kv_tokens: int  # the first seed's (the system-prompt control's varies by seed)
    control: bool
    policy: str
    seeds: int
    throughput_tok_s: float  # input + output tokens served in [warm-up, T] per second
    spec_throughput_tok_s: float  # SPEC section 6: first arrival to last finish
    max_diff: float
    avg_diff: float
    max_diff_per_throughput: float  # max_diff / throughput_tok_s
    prefix_hit_rate: float
    preemptions: float
    backlogged_clients: float  # backlogged >= 95% of [warm-up, T]
    clients: int
    # Ratios to VTC's in the same (variant, pool); None without a VTC run.
    throughput_vs_vtc: float | None = None
    max_diff_vs_vtc: float | None = None
    avg_diff_vs_vtc: float | None = None
    max_diff_per_throughput_vs_vtc: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> FrontierCell:
        return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})


def window_throughput(records: Sequence[ResultRecord], start_s: float, end_s: float) -> float:
    """Input + output tokens served in [start_s, end_s] per second, each request's tokens
    spread over its first token to its finish (as SPEC section 6 spreads service)."""
    lo, hi = np.array([start_s]), np.array([end_s])
    served = sum(
        float(sp.service_between(lo, hi)[0]) for sp in service_spans(records, TOKENS).values()
    )
    return served / (end_s - start_s)


def frontier_jobs(
    scenarios: Sequence[Scenario],
    policies: Sequence[str] = FRONTIER_POLICIES,
    seeds: Sequence[int] = DEFAULT_SEEDS,
) -> list[Job]:
    jobs = []
    for index, scenario in enumerate(scenarios):
        for seed in seeds:
            workload = scenario.workload(seed)
            config = SchedulerConfig(
                kv_tokens=scenario.kv_tokens(workload), **LOCALITY_ENGINE_SETTINGS
            )
            variant = f"{index}|{scenario.variant}|pool {scenario.pool_fraction:g}|seed {seed}"
            jobs += [Job(workload, p, config, DEFAULT_PROFILE, variant) for p in policies]
    return jobs


def _ratio(value: float, reference: float) -> float | None:
    return value / reference if reference else None


def frontier_cells(
    scenarios: Sequence[Scenario], outcomes: Sequence[RunOutcome]
) -> list[FrontierCell]:
    groups: dict[tuple[int, str], list[RunOutcome]] = {}
    for outcome in outcomes:
        index = int(outcome.job.variant.split("|", 1)[0])
        groups.setdefault((index, outcome.policy), []).append(outcome)
    cells: list[FrontierCell] = []
    for (index, policy), runs in groups.items():
        scenario = scenarios[index]
        workload = runs[0].workload
        throughput = statistics.fmean(
            window_throughput(o.results, workload.warmup_s, workload.duration_s) for o in runs
        )
        max_diff = statistics.fmean(o.report.max_diff for o in runs)
        cells.append(
            FrontierCell(
                variant=scenario.variant,
                pool_fraction=scenario.pool_fraction,
                kv_tokens=runs[0].job.config.kv_tokens,
                control=scenario.control,
                policy=policy,
                seeds=len(runs),
                throughput_tok_s=throughput,
                spec_throughput_tok_s=statistics.fmean(o.report.throughput_tok_s for o in runs),
                max_diff=max_diff,
                avg_diff=statistics.fmean(o.report.avg_diff for o in runs),
                max_diff_per_throughput=max_diff / throughput if throughput else 0.0,
                prefix_hit_rate=statistics.fmean(prefix_hit_rate(o.results) for o in runs),
                preemptions=statistics.fmean(o.preemptions for o in runs),
                backlogged_clients=statistics.fmean(len(o.report.backlogged) for o in runs),
                clients=len(workload.clients),
            )
        )
    return with_vtc_ratios(cells)


def with_vtc_ratios(cells: Sequence[FrontierCell]) -> list[FrontierCell]:
    """Each cell with its ratios to VTC's cell of the same (variant, pool)."""
    vtc = {(c.variant, c.pool_fraction): c for c in cells if c.policy == "vtc"}
    out = []
    for cell in cells:
        base = vtc.get((cell.variant, cell.pool_fraction))
        if base is None:
            out.append(cell)
            continue
        out.append(
            replace(
                cell,
                throughput_vs_vtc=_ratio(cell.throughput_tok_s, base.throughput_tok_s),
                max_diff_vs_vtc=_ratio(cell.max_diff, base.max_diff),
                avg_diff_vs_vtc=_ratio(cell.avg_diff, base.avg_diff),
                max_diff_per_throughput_vs_vtc=_ratio(
                    cell.max_diff_per_throughput, base.max_diff_per_throughput
                ),
            )
        )
    return out


def frontier_settings(
    scenarios: Sequence[Scenario], policies: Sequence[str], seeds: Sequence[int]
) -> dict[str, Any]:
    spec = next((s.spec for s in scenarios if s.spec is not None), DocumentsSpec())
    return {
        "profile": DEFAULT_PROFILE,
        "preset": "engine: optimistic admission, chunked prefill, prefix caching on",
        "workload": spec.describe(),
        "duration_s": spec.duration_s,
        "metrics": "SPEC section 6: T = duration, w = 60 s, warm-up 30 s; throughput over "
        "[warm-up, T] (spec_throughput_tok_s: first arrival to last finish)",
        "pools": sorted({s.pool_fraction for s in scenarios}),
        "variants": list(dict.fromkeys(s.variant for s in scenarios)),
        "policies": list(policies),
        "seeds": list(seeds),
    }


def run_frontier(
    scenarios: Sequence[Scenario],
    policies: Sequence[str] = FRONTIER_POLICIES,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    workers: int = DEFAULT_WORKERS,
    progress: ProgressFn | None = None,
) -> list[FrontierCell]:
    """Every (scenario, policy, seed) through the simulator; one cell per (scenario, policy)."""
    outcomes = run_jobs(frontier_jobs(scenarios, policies, seeds), workers, progress)
    cells = frontier_cells(scenarios, outcomes)
    order = {p: i for i, p in enumerate(policies)}
    position = {(s.variant, s.pool_fraction): i for i, s in enumerate(scenarios)}
    return sorted(cells, key=lambda c: (position[(c.variant, c.pool_fraction)], order[c.policy]))
