"""The long-context-neighbour experiment: what a tenant flooding long prompts does to
light chat tenants, and what sharing what it holds gives back.

Two cases (tokenfair/workloads/long_neighbor.py): `a10g`, the A10G Llama-2-7B profile
with a 20,000-token pool (long prompts wait for memory), and `h200`, the H200
Llama-3-8B roofline with a 900,000-token pool (nothing waits for memory; the step is
what is contended). Each runs the chat traffic alone, then the whole workload under
`fcfs`, `vtc` and `vtc-preempt` with memory and step not shared (as tokenfair ran before
it shared them), and under `vtc` with the engine's defaults (shared). The rows compare
the chat tenants' TTFT and TPOT with their alone figures, and the long tenant's
throughput with what it gets under `fcfs`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.experiments.runner import Job, RunOutcome
from tokenfair.experiments.workloads import Workload
from tokenfair.results import ResultRecord
from tokenfair.workloads.long_neighbor import (
    A10G_CASE,
    H200_CASE,
    LONG_CLIENT,
    LongNeighborSpec,
)
from tokenfair.workloads.suites import generate_workload


@dataclass(frozen=True, slots=True)
class NeighborCase:
    name: str
    spec: LongNeighborSpec
    profile: str
    kv_tokens: int


CASES = (
    NeighborCase("a10g", A10G_CASE, "a10g-llama-7b", 20_000),
    NeighborCase("h200", H200_CASE, "h200-llama-3-8b", 900_000),
)
# Variants for benchmarks/long_neighbor.py: other rates, 100k-token prompts, and
# prompts of 48k-64k tokens overloading a pool that holds two of them (the memory
# victims' case).
VARIANT_CASES = (
    NeighborCase("a10g-long-1/s", replace(A10G_CASE, long_rate=1.0), "a10g-llama-7b", 20_000),
    NeighborCase("a10g-long-4/s", replace(A10G_CASE, long_rate=4.0), "a10g-llama-7b", 20_000),
    NeighborCase("a10g-chat-2/s", replace(A10G_CASE, chat_rate=2.0), "a10g-llama-7b", 20_000),
    NeighborCase(
        "h200-100k",
        replace(H200_CASE, long_prompt=(90_000, 110_000), long_rate=0.25),
        "h200-llama-3-8b",
        900_000,
    ),
    NeighborCase(
        "h200-48k-64k-small-pool",
        replace(H200_CASE, long_prompt=(49_152, 65_536), long_rate=1.0),
        "h200-llama-3-8b",
        140_000,
    ),
)
# Memory and step not shared: the engine as it ran before it shared what a tenant holds.
CHARGES_ONLY: dict[str, Any] = {"share_memory": False, "step_share_tokens": None}
ALONE = "chat alone"
# (label, policy, settings over the engine's defaults)
RUNS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("fcfs", "fcfs", CHARGES_ONLY),
    ("vtc, charges only", "vtc", CHARGES_ONLY),
    ("vtc-preempt, charges only", "vtc-preempt", CHARGES_ONLY),
    ("vtc (default: holdings shared)", "vtc", {}),
)
# The trade: holdings shared, at several step shares (the default is 768).
STEP_SHARES = (256, 512, 768, 1024, 2048, 4096)
SWEEP_PREFIX = "vtc, step share "
SWEEP: tuple[tuple[str, str, dict[str, Any]], ...] = tuple(
    (f"{SWEEP_PREFIX}{tokens}", "vtc", {"step_share_tokens": tokens}) for tokens in STEP_SHARES
)
DEFAULT_SEEDS = (0, 1, 2)
NEIGHBOR_RUN_PREFIX = "neighbor:"  # its workloads' names (not a suite's)


def case_workload(case: NeighborCase, seed: int, *, with_long: bool = True) -> Workload:
    spec = case.spec
    records = generate_workload(spec.client_specs(with_long=with_long), spec.duration_s, seed)
    return Workload(
        name=f"{NEIGHBOR_RUN_PREFIX}{case.name}" + ("" if with_long else "-alone"),
        records=tuple(records.records),
        duration_s=spec.duration_s,
        description=spec.describe(),
    )


def neighbor_jobs(
    seeds: Sequence[int] = DEFAULT_SEEDS,
    runs: Sequence[tuple[str, str, dict[str, Any]]] = RUNS + SWEEP,
    cases: Sequence[NeighborCase] = CASES,
) -> list[Job]:
    """Every case's runs: the chat traffic alone, then each of `runs`; the job's variant
    is `case|label|seed`."""
    jobs = []
    for case in cases:

        def config(settings: dict[str, Any], case: NeighborCase = case) -> SchedulerConfig:
            return SchedulerConfig.from_dict(
                {"kv_tokens": case.kv_tokens, "enable_prefix_caching": True, **settings}
            )

        for seed in seeds:
            alone = case_workload(case, seed, with_long=False)
            variant = f"{case.name}|{ALONE}|{seed}"
            jobs.append(Job(alone, "vtc", config(CHARGES_ONLY), case.profile, variant))
            workload = case_workload(case, seed)
            for label, policy, settings in runs:
                variant = f"{case.name}|{label}|{seed}"
                jobs.append(Job(workload, policy, config(settings), case.profile, variant))
    return jobs


def is_neighbor_outcome(outcome: RunOutcome) -> bool:
    return outcome.workload.name.startswith(NEIGHBOR_RUN_PREFIX)


@dataclass(frozen=True, slots=True)
class NeighborRow:
    """One run of one case, medians over the seeds."""

    case: str
    run: str
    seeds: int
    chat_ttft_p50_s: float
    chat_ttft_p99_s: float
    chat_tpot_p50_s: float
    long_tok_s: float | None  # the long tenant's tokens over its span (none alone)
    chat_preemptions: float  # the chat tenants' requests pushed out, per run
    # Against the chat traffic alone, and the long tenant's fcfs throughput.
    ttft_p99_x_alone: float | None = None
    tpot_p50_x_alone: float | None = None
    long_x_fcfs: float | None = None


def chat_latencies(results: Sequence[ResultRecord]) -> tuple[float, float, float]:
    """The chat tenants' TTFT p50 and p99 and TPOT p50, in seconds."""
    chat = [r for r in results if r.client != LONG_CLIENT and r.first_token_s is not None]
    ttft = np.array([r.first_token_s - r.arrival_s for r in chat])  # type: ignore[operator]
    tpot = np.array(
        [
            (r.finish_s - r.first_token_s) / (r.output_tokens - 1)  # type: ignore[operator]
            for r in chat
            if r.output_tokens > 1 and r.finish_s is not None
        ]
    )
    return (
        float(np.percentile(ttft, 50)),
        float(np.percentile(ttft, 99)),
        float(np.percentile(tpot, 50)) if len(tpot) else 0.0,
    )


def long_throughput(results: Sequence[ResultRecord]) -> float | None:
    """The long tenant's tokens over the time from the first arrival to its last finish."""
    long = [r for r in results if r.client == LONG_CLIENT and r.finish_s is not None]
    if not long:
        return None
    first = min(r.arrival_s for r in results)
    span = max(r.finish_s or 0.0 for r in long) - first
    return sum(r.input_tokens + r.output_tokens for r in long) / span


def neighbor_rows(outcomes: Sequence[RunOutcome]) -> list[NeighborRow]:
    groups: dict[tuple[str, str], list[RunOutcome]] = {}
    for outcome in outcomes:
        case, label, _ = outcome.job.variant.split("|")
        groups.setdefault((case, label), []).append(outcome)
    rows = []
    for (case, label), runs in groups.items():
        latencies = [chat_latencies(o.results) for o in runs]
        throughputs = [t for o in runs if (t := long_throughput(o.results)) is not None]
        rows.append(
            NeighborRow(
                case=case,
                run=label,
                seeds=len(runs),
                chat_ttft_p50_s=statistics.median(x[0] for x in latencies),
                chat_ttft_p99_s=statistics.median(x[1] for x in latencies),
                chat_tpot_p50_s=statistics.median(x[2] for x in latencies),
                long_tok_s=statistics.median(throughputs) if throughputs else None,
                chat_preemptions=statistics.mean(
                    sum(r.preemptions for r in o.results if r.client != LONG_CLIENT) for o in runs
                ),
            )
        )
    return [_with_ratios(row, rows) for row in rows]


def _with_ratios(row: NeighborRow, rows: Sequence[NeighborRow]) -> NeighborRow:
    alone = next((r for r in rows if r.case == row.case and r.run == ALONE), None)
    fcfs = next((r for r in rows if r.case == row.case and r.run == "fcfs"), None)

    def ratio(value: float | None, base: float | None) -> float | None:
        return value / base if value is not None and base else None

    return replace(
        row,
        ttft_p99_x_alone=ratio(row.chat_ttft_p99_s, alone.chat_ttft_p99_s if alone else None),
        tpot_p50_x_alone=ratio(row.chat_tpot_p50_s, alone.chat_tpot_p50_s if alone else None),
        long_x_fcfs=ratio(row.long_tok_s, fcfs.long_tok_s if fcfs else None),
    )


def neighbor_settings(seeds: Sequence[int]) -> dict[str, Any]:
    return {
        "seeds": list(seeds),
        "cases": {
            case.name: {
                "profile": case.profile,
                "kv_tokens": case.kv_tokens,
                "workload": case.spec.describe(),
            }
            for case in CASES
        },
        "engine": "engine preset, prefix caching on; charges only = share_memory off, no step share",
    }
