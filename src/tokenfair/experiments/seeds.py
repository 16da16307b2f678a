"""The synthetic suites drawn again with other seeds: how far a policy's figures move
from one draw of the same suite to the next (the arena trace is one fixed trace).

A suite's draw 0 is the one every table shows; `experiment paper --seeds N` also runs
draws 1 .. N-1 of every suite under the same policies (jobs marked `seed k`), and the
report gives each policy's mean and range over all N.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenfair.experiments.runner import Job, RunOutcome
from tokenfair.experiments.workloads import Workload

SEED_VARIANT = "seed "  # a job's variant `seed 3`: draw 3 of its suite


def is_seed_outcome(outcome: RunOutcome) -> bool:
    return outcome.job.variant.startswith(SEED_VARIANT)


def seed_variant(seed: int) -> str:
    return f"{SEED_VARIANT}{seed}"


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over the draws: its mean, lowest and highest."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.fmean(values), min(values), max(values))


@dataclass(frozen=True, slots=True)
class SeedSpread:
    """One policy on one suite over `seeds` draws."""

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


def reseeded(jobs: Sequence[Job], seeds: int, draw: Callable[[str, int], Workload]) -> list[Job]:
    """Each job of a synthetic suite again on draws 1 .. seeds-1 (`draw(name, seed)`:
    the suite's workload for that seed), marked `seed k`."""
    return [
        Job(draw(job.workload.name, seed), job.policy, job.config, job.profile, seed_variant(seed))
        for seed in range(1, seeds)
        for job in jobs
    ]
