"""The paper's ablation: how VTC's service difference depends on the KV pool and lengths.

VTC's bound grows with the batch it can hold (B = max(w_in L_in, w_out M)), so the
paper varies the KV pool (10k, 35k, 65k tokens, requests of 256/256 tokens) and the
request length (256, 512, 768 tokens in and out, 10k pool) on an overload workload and
plots the absolute difference in service between the two clients.

The workload is the `overload` suite's shape (two uniform clients, one asking twice as
much as the other, 360 s) at twice its rates, 3 and 6 req/s for 256/256-token requests.
At the suite's own 1.5 and 3 req/s the 65k pool serves the lighter client nearly
everything it asks for, so it is no longer backlogged and the difference would measure
its lower demand, not unfairness; at 3 and 6 req/s both clients stay backlogged in
every setting. Longer requests come at proportionally lower rates (x 256 / length), so
every setting asks for the same tokens per second; at full rates the 768-token runs
would queue an hour of work, which only slows the simulation down (the drain after T
is not measured).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.experiments.runner import Job, RunOutcome
from tokenfair.experiments.workloads import Workload
from tokenfair.fairness.bounds import service_bound
from tokenfair.workloads.arrivals import Uniform
from tokenfair.workloads.lengths import fixed
from tokenfair.workloads.suites import ClientWorkload, generate_workload

KV_POOLS = (10_000, 35_000, 65_000)
REQUEST_LENGTHS = (256, 512, 768)
BASE_KV_TOKENS = KV_POOLS[0]
BASE_LENGTH = REQUEST_LENGTHS[0]
RATES = (3.0, 6.0)
DURATION_S = 360.0


@dataclass(frozen=True, slots=True)
class AblationPoint:
    kv_tokens: int
    length: int  # input and output tokens of every request

    @property
    def name(self) -> str:
        return f"ablation-kv{self.kv_tokens}-len{self.length}"


def ablation_points() -> list[AblationPoint]:
    """The pool sweep at the base length, then the length sweep at the base pool."""
    points = [AblationPoint(kv, BASE_LENGTH) for kv in KV_POOLS]
    points += [AblationPoint(BASE_KV_TOKENS, n) for n in REQUEST_LENGTHS if n != BASE_LENGTH]
    return points


def ablation_workload(point: AblationPoint, seed: int = 0) -> Workload:
    scale = BASE_LENGTH / point.length
    clients = [
        ClientWorkload(f"client-{i}", Uniform(rate * scale), fixed(point.length, point.length))
        for i, rate in enumerate(RATES)
    ]
    suite = generate_workload(clients, DURATION_S, seed, point.name)
    return Workload(
        name=point.name,
        records=tuple(suite.records),
        duration_s=DURATION_S,
        description=(
            f"2 clients, uniform {RATES[0] * scale:g} and {RATES[1] * scale:g} req/s, "
            f"{point.length}/{point.length} tokens, KV pool {point.kv_tokens:,} tokens"
        ),
    )


def ablation_jobs(policies: Sequence[str] = ("vtc",), seed: int = 0) -> list[Job]:
    """One job per (ablation point, policy), under the paper's system with that pool."""
    jobs = []
    for point in ablation_points():
        workload = ablation_workload(point, seed)
        config = SchedulerConfig.paper(kv_tokens=point.kv_tokens)
        for policy in policies:
            jobs.append(Job(workload, policy, config, variant=f"kv={point.kv_tokens}"))
    return jobs


@dataclass(frozen=True, slots=True)
class AblationRow:
    """One ablation measurement: the accumulated service difference against the bound."""

    policy: str
    kv_tokens: int
    length: int
    max_acc_diff: float  # largest accumulated service difference over the ticks
    mean_acc_diff: float
    bound: float  # B of SPEC section 3 for this pool and length
    scope: str  # which clients the difference is taken over
    max_diff: float  # the windowed service difference D, for reference
    throughput_tok_s: float

    @property
    def ratio_to_bound(self) -> float:
        return self.max_acc_diff / self.bound if self.bound else float("nan")


def ablation_row(outcome: RunOutcome) -> AblationRow:
    curve = outcome.report.accumulated_difference
    kv_tokens = outcome.job.config.kv_tokens
    return AblationRow(
        policy=outcome.policy,
        kv_tokens=kv_tokens,
        length=outcome.workload.records[0].input_tokens,
        max_acc_diff=curve.peak,
        mean_acc_diff=float(np.mean(curve.values)) if curve.values.size else 0.0,
        bound=service_bound(outcome.workload.records, kv_tokens),
        scope=curve.scope,
        max_diff=outcome.report.max_diff,
        throughput_tok_s=outcome.report.throughput_tok_s,
    )


def pool_sweep(rows: Sequence[AblationRow], policy: str = "vtc") -> list[AblationRow]:
    """Rows of the KV pool sweep (base length), smallest pool first."""
    chosen = [r for r in rows if r.policy == policy and r.length == BASE_LENGTH]
    return sorted(chosen, key=lambda r: r.kv_tokens)


def length_sweep(rows: Sequence[AblationRow], policy: str = "vtc") -> list[AblationRow]:
    """Rows of the request length sweep (base pool), shortest first."""
    chosen = [r for r in rows if r.policy == policy and r.kv_tokens == BASE_KV_TOKENS]
    return sorted(chosen, key=lambda r: r.length)
