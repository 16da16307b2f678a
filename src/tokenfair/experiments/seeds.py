"""The paper's workloads drawn again: how far a policy's figures move from one draw of
the same workload to the next.

A workload's draw 0 is the one every table shows; `experiment paper --seeds N` also
runs draws 1 .. N-1 of every workload under the same policies (jobs marked `seed k`):
a synthetic suite generated with seed k, and the arena trace, one fixed trace, with
every arrival moved by a uniform +-1 ms drawn with seed k (as benchmarks/fluid_ideal.py
replays it). The report gives each policy's median and range over all N: under VTC,
Max Diff swings with timing detail far below anything measured (docs/simulator.md).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenfair.experiments.runner import Job, RunOutcome
from tokenfair.experiments.workloads import Workload
from tokenfair.workloads.trace import TraceRecord

SEED_VARIANT = "seed "  # a job's variant `seed 3`: draw 3 of its workload
JITTER_S = 1e-3  # a fixed trace's draws move each arrival by up to this much


def is_seed_outcome(outcome: RunOutcome) -> bool:
    return outcome.job.variant.startswith(SEED_VARIANT)


def seed_variant(seed: int) -> str:
    return f"{SEED_VARIANT}{seed}"


def jittered_records(records: Sequence[TraceRecord], seed: int) -> list[TraceRecord]:
    """Every arrival moved by a uniform +-JITTER_S drawn with `seed` (none before 0)."""
    rng = random.Random(seed)
    return [
        dataclasses.replace(r, arrival_s=max(0.0, r.arrival_s + rng.uniform(-JITTER_S, JITTER_S)))
        for r in records
    ]


def jittered(workload: Workload, seed: int) -> Workload:
    """A fixed trace's draw `seed`: the same requests, measured alike, each arrival
    moved by up to 1 ms."""
    return dataclasses.replace(workload, records=tuple(jittered_records(workload.records, seed)))


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over the draws: its median, mean, lowest and highest."""

    median: float
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), statistics.fmean(values), min(values), max(values))


@dataclass(frozen=True, slots=True)
class SeedSpread:
    """One policy on one workload (a suite, or the arena trace) over `seeds` draws."""

    suite: str
    policy: str
    label: str
    seeds: int
    max_diff: Spread
    avg_diff: Spread
    throughput_tok_s: Spread


def seed_spreads(outcomes: Sequence[RunOutcome]) -> list[SeedSpread]:
    """Per suite and policy (in the order first seen), over every draw among
    `outcomes` (draw 0's unmarked runs and the `seed k` ones); none where one draw ran."""
    draws: dict[tuple[str, str], list[RunOutcome]] = {}
    for outcome in outcomes:
        draws.setdefault((outcome.workload.name, outcome.policy), []).append(outcome)
    rows = []
    for (suite, policy), runs in draws.items():
        if len(runs) < 2:
            continue
        reports = [run.report for run in runs]
        rows.append(
            SeedSpread(
                suite=suite,
                policy=policy,
                label=runs[0].label,
                seeds=len(runs),
                max_diff=Spread.of([r.max_diff for r in reports]),
                avg_diff=Spread.of([r.avg_diff for r in reports]),
                throughput_tok_s=Spread.of([r.throughput_tok_s for r in reports]),
            )
        )
    return rows


def reseeded(
    jobs: Sequence[Job], seeds: int, draw: Callable[[Workload, int], Workload]
) -> list[Job]:
    """Each job again on draws 1 .. seeds-1 of its workload (`draw(workload, seed)`),
    marked `seed k`."""
    return [
        Job(draw(job.workload, seed), job.policy, job.config, job.profile, seed_variant(seed))
        for seed in range(1, seeds)
        for job in jobs
    ]
