"""Every fairness metric of one run, gathered into one typed `FairnessReport`.

`fairness_report(records, ...)` computes the paper's table row (Max/Avg Diff, Diff Var,
throughput), the per-tick series behind it, Jain's index over backlogged clients, the
per-client counts, TTFT percentiles and shares, and the accumulated service difference
on the figures' dense grid (computed here once per run, read by tables, targets and
figures alike). `FairnessReport.to_json()` is what `tokenfair metrics` prints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenfair.core.cost import DEFAULT_COST, CostFunction, LinearCost
from tokenfair.fairness.bounds import ServiceDifference, accumulated_difference
from tokenfair.fairness.metrics import (
    BACKLOG_FRACTION,
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    NUM_TICK_INTERVALS,
    accumulated_service_difference,
    backlog_fractions,
    diff_stats,
    jain_index,
    request_counts,
    service_difference,
    service_shares,
    service_totals,
    throughput,
    ttft_percentiles,
    weight_of,
)
from tokenfair.fairness.spans import (
    accumulated_service,
    demand_rates,
    service_rates,
    service_spans,
    tick_times,
    tick_windows,
)
from tokenfair.results import ResultRecord


@dataclass(frozen=True, slots=True)
class TTFTStats:
    """Time to first token from arrival, seconds; None where no request had one."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """A client's requests: total, served (got a first token), and by finish reason."""

    total: int = 0
    served: int = 0
    stop: int = 0
    length: int = 0
    abort: int = 0
    rejected: int = 0
    unfinished: int = 0


@dataclass(frozen=True, slots=True)
class ClientReport:
    requests: RequestCounts
    ttft_s: TTFTStats
    service: float  # total service received over the whole run
    service_share: float  # its fraction of all service delivered
    weight: float
    backlog_fraction: float  # of [warmup, T] with a request waiting
    # Over [warmup, T] only (the drain after T left out): its service, and its share of
    # all clients' service then.
    window_service: float = 0.0
    window_share: float = 0.0
    # For a backlogged client: its share of the backlogged clients' service over
    # [warmup, T], and its weight's share of theirs, what a weighted policy promises it
    # (None for a client that was not backlogged).
    backlogged_share: float | None = None
    backlogged_weight_share: float | None = None


@dataclass(frozen=True, slots=True)
class FairnessParams:
    """What the report was measured with."""

    duration_s: float  # T
    window_s: float  # w
    warmup_s: float
    cost: str  # how service is priced, e.g. "linear (w_in=1, w_out=2)"
    weights: dict[str, float] | None = None
    backlog_fraction: float = BACKLOG_FRACTION
    duration_from_data: bool = False  # T was taken from the last arrival


@dataclass(frozen=True, slots=True)
class FairnessReport:
    """One run's fairness metrics (SPEC section 6); see tokenfair.fairness.metrics."""

    params: FairnessParams
    max_diff: float
    avg_diff: float
    diff_var: float
    throughput_tok_s: float
    num_requests: int
    num_served: int
    ticks: list[float]
    service_diff: list[float]  # D per tick
    service_rate: dict[str, list[float]]  # y_j per tick
    demand_rate: dict[str, list[float]]  # r_j per tick
    acc_service_diff: list[float]  # per tick, over all served clients (the artifact's)
    acc_service_diff_backlogged: list[float]  # per tick, over `backlogged`
    backlogged: list[str]  # backlogged for >= backlog_fraction of [warmup, T]
    jain_backlogged: float | None
    jain_per_tick: list[float | None]
    jain_per_tick_mean: float | None
    jain_per_tick_min: float | None
    clients: dict[str, ClientReport]
    ttft_s: TTFTStats  # over all requests
    # Dense accumulated service difference: the curve VTC's bound speaks about.
    accumulated_difference: ServiceDifference = field(repr=False)

    @property
    def num_rejected(self) -> int:
        return sum(c.requests.rejected for c in self.clients.values())

    def to_json(self, full: bool = True) -> dict[str, Any]:
        """JSON-able data; `full=False` leaves out the per-client per-tick series."""
        curve = self.accumulated_difference
        out: dict[str, Any] = {
            "params": _plain(self.params),
            "max_diff": self.max_diff,
            "avg_diff": self.avg_diff,
            "diff_var": self.diff_var,
            "throughput_tok_s": self.throughput_tok_s,
            "num_requests": self.num_requests,
            "num_served": self.num_served,
            "num_rejected": self.num_rejected,
            "ticks": self.ticks,
            "service_diff": self.service_diff,
            "acc_service_diff": self.acc_service_diff,
            "acc_service_diff_backlogged": self.acc_service_diff_backlogged,
            "acc_diff_peak": curve.peak,
            "acc_diff_final": curve.final,
            "acc_diff_scope": curve.scope,
            "backlogged": self.backlogged,
            "jain_backlogged": _finite(self.jain_backlogged),
            "jain_per_tick_mean": self.jain_per_tick_mean,
            "jain_per_tick_min": self.jain_per_tick_min,
            "clients": {c: _plain(v) for c, v in self.clients.items()},
            "ttft_s": _plain(self.ttft_s),
        }
        if full:
            out["service_rate"] = self.service_rate
            out["demand_rate"] = self.demand_rate
            out["jain_per_tick"] = [_finite(j) for j in self.jain_per_tick]
        return out


def _plain(value: Any) -> Any:
    """A dataclass (nested) as a dict of its fields."""
    if hasattr(value, "__dataclass_fields__"):
        return {name: _plain(getattr(value, name)) for name in value.__dataclass_fields__}
    return value


def _finite(value: float | None) -> float | None:
    """NaN/inf are not JSON; report them as null."""
    return None if value is None or not math.isfinite(value) else value


def describe_cost(cost: CostFunction) -> str:
    if isinstance(cost, LinearCost):
        return f"linear (w_in={cost.w_in:g}, w_out={cost.w_out:g})"
    return type(cost).__name__


def default_duration(records: Sequence[ResultRecord]) -> float:
    """T from the data: the last arrival rounded down to whole seconds (the artifact's)."""
    return float(math.floor(max((r.arrival_s for r in records), default=0.0)))


def _jain_per_tick(
    records: Sequence[ResultRecord],
    service: Mapping[str, list[float]],
    ticks: Sequence[float],
    window_s: float,
    warmup_s: float,
    weights: Mapping[str, float] | None,
    backlog_fraction: float,
) -> list[float | None]:
    out: list[float | None] = []
    lo, hi = tick_windows(ticks, window_s, warmup_s)
    for k in range(len(ticks)):
        fractions = backlog_fractions(records, lo[k], hi[k]) if records else {}
        in_window = [c for c, f in fractions.items() if f >= backlog_fraction]
        rates = [service.get(c, [0.0] * len(ticks))[k] / weight_of(weights, c) for c in in_window]
        out.append(_finite(jain_index(rates)) if len(in_window) >= 2 else None)
    return out


def fairness_report(
    records: Sequence[ResultRecord],
    *,
    duration_s: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    warmup_s: float = DEFAULT_WARMUP_S,
    weights: Mapping[str, float] | None = None,
    cost: CostFunction = DEFAULT_COST,
    backlog_fraction: float = BACKLOG_FRACTION,
) -> FairnessReport:
    """Every fairness metric of one run.

    `duration_s=None` takes T from the data (`default_duration`). Raises ValueError when
    T does not exceed the warm-up or the window is not positive.
    """
    from_data = duration_s is None
    if duration_s is None:
        duration_s = default_duration(records)
    if not duration_s > warmup_s:
        source = "the last arrival" if from_data else "duration"
        raise ValueError(
            f"T ({duration_s:g} s, from {source}) must exceed the warm-up ({warmup_s:g} s)"
        )
    if window_s <= 0:
        raise ValueError(f"window must be > 0 s, got {window_s:g}")
    spans = service_spans(records, cost)
    ticks = tick_times(duration_s, warmup_s, NUM_TICK_INTERVALS)
    service = service_rates(spans, ticks, window_s, warmup_s)
    demand = demand_rates(spans, ticks, window_s, warmup_s)
    diffs = service_difference(service, demand, weights)
    accumulated = accumulated_service(spans, ticks, warmup_s)

    fractions = backlog_fractions(records, warmup_s, duration_s) if records else {}
    backlogged = [c for c, f in fractions.items() if f >= backlog_fraction]
    measured = {
        c: float(sp.service_between(np.array([warmup_s]), np.array([duration_s]))[0])
        for c, sp in spans.items()
    }
    jain_overall = (
        jain_index([measured.get(c, 0.0) / weight_of(weights, c) for c in backlogged])
        if len(backlogged) >= 2
        else None
    )
    jain_ticks = _jain_per_tick(
        records, service, ticks, window_s, warmup_s, weights, backlog_fraction
    )
    defined = [j for j in jain_ticks if j is not None]

    totals = service_totals(spans)
    shares = service_shares(totals)
    window_shares = service_shares(measured)
    backlogged_shares = service_shares({c: measured.get(c, 0.0) for c in backlogged})
    backlogged_weight = sum(weight_of(weights, c) for c in backlogged)
    ttft = {c: TTFTStats(**stats) for c, stats in ttft_percentiles(records).items()}
    clients = {
        c: ClientReport(
            requests=RequestCounts(**counts),
            ttft_s=ttft[c],
            service=totals.get(c, 0.0),
            service_share=shares.get(c, 0.0),
            weight=weight_of(weights, c),
            backlog_fraction=fractions.get(c, 0.0),
            window_service=measured.get(c, 0.0),
            window_share=window_shares.get(c, 0.0),
            backlogged_share=backlogged_shares.get(c) if len(backlogged) >= 2 else None,
            backlogged_weight_share=(
                weight_of(weights, c) / backlogged_weight
                if c in backlogged and len(backlogged) >= 2
                else None
            ),
        )
        for c, counts in request_counts(records).items()
    }
    stats = diff_stats(diffs)
    return FairnessReport(
        params=FairnessParams(
            duration_s=duration_s,
            window_s=window_s,
            warmup_s=warmup_s,
            cost=describe_cost(cost),
            weights=dict(weights) if weights is not None else None,
            backlog_fraction=backlog_fraction,
            duration_from_data=from_data,
        ),
        max_diff=stats["max_diff"],
        avg_diff=stats["avg_diff"],
        diff_var=stats["diff_var"],
        throughput_tok_s=throughput(records),
        num_requests=len(records),
        num_served=sum(r.served for r in records),
        ticks=ticks,
        service_diff=diffs,
        service_rate=service,
        demand_rate=demand,
        acc_service_diff=accumulated_service_difference(accumulated, None, weights),
        acc_service_diff_backlogged=accumulated_service_difference(
            accumulated, backlogged, weights
        ),
        backlogged=backlogged,
        jain_backlogged=_finite(jain_overall),
        jain_per_tick=jain_ticks,
        jain_per_tick_mean=float(np.mean(defined)) if defined else None,
        jain_per_tick_min=min(defined) if defined else None,
        clients=clients,
        ttft_s=ttft["*"],
        accumulated_difference=accumulated_difference(
            records, backlogged, duration_s, warmup_s, weights, cost
        ),
    )
