"""Fine-grained time series for the figures (the metrics use only 19 ticks).

The paper's figures plot service rate and response time as continuous curves, so the
plots sample the same quantities as the metrics on a denser grid: service rate over a
sliding window of w seconds (as in SPEC section 6), response time as the mean TTFT of
requests arriving in short bins, accumulated service from the end of warm-up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from tokenfair.core.cost import DEFAULT_COST, CostFunction, request_cost
from tokenfair.fairness.metrics import NUM_TICK_INTERVALS, service_difference
from tokenfair.fairness.spans import accumulated_service, demand_rates, service_rates, service_spans
from tokenfair.results import ResultRecord

# Points per curve: dense enough to look continuous, cheap for thousands of requests.
GRID_POINTS = 120
# The windowed service difference is sampled this many times per metric tick interval,
# so the dense curve passes through each of the metrics' 19 tick values.
POINTS_PER_TICK = 6
# Response-time bins are this fraction of the rate window: short enough to show a
# client's queue building up within one ON period.
TTFT_BIN_FRACTION = 0.25


def rate_grid(duration_s: float, window_s: float) -> np.ndarray:
    """Window centres from w/2 to T - w/2 (each window lies inside [0, T])."""
    half = window_s / 2
    if duration_s <= window_s:
        return np.array([duration_s / 2])
    return np.linspace(half, duration_s - half, GRID_POINTS)


def service_rate_curves(
    records: Sequence[ResultRecord],
    duration_s: float,
    window_s: float,
    cost: CostFunction = DEFAULT_COST,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per client, service received in [t - w/2, t + w/2] divided by w, at each centre t."""
    centres = rate_grid(duration_s, window_s)
    spans = service_spans(records, cost)
    lo, hi = centres - window_s / 2, centres + window_s / 2
    return centres, {c: sp.service_between(lo, hi) / window_s for c, sp in spans.items()}


def response_time_curves(
    records: Sequence[ResultRecord], duration_s: float, window_s: float
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per client, mean TTFT (s) of the requests arriving in each bin; NaN where none."""
    width = max(window_s * TTFT_BIN_FRACTION, duration_s / GRID_POINTS)
    edges = np.arange(0.0, duration_s + width, width)
    centres = (edges[:-1] + edges[1:]) / 2
    by_client: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        if rec.first_token_s is not None:
            by_client.setdefault(rec.client, []).append((rec.arrival_s, rec.ttft_s or 0.0))
    curves = {}
    for client in sorted(by_client):
        pairs = np.array(by_client[client])
        index = np.digitize(pairs[:, 0], edges) - 1
        sums = np.bincount(index, weights=pairs[:, 1], minlength=len(edges))[: len(centres)]
        counts = np.bincount(index, minlength=len(edges))[: len(centres)]
        with np.errstate(invalid="ignore", divide="ignore"):
            curves[client] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return centres, curves


def accumulated_difference_curve(
    records: Sequence[ResultRecord],
    clients: Sequence[str] | None,
    duration_s: float,
    warmup_s: float,
    weights: Mapping[str, float] | None = None,
    cost: CostFunction = DEFAULT_COST,
) -> tuple[np.ndarray, np.ndarray]:
    """max_j A_j(t) - min_j A_j(t) over `clients` (None: all served), t from warmup to T.

    A_j(t) is j's service (divided by its weight) in [warmup, t]. Returns times and the
    curve; zeros when fewer than two clients are compared.
    """
    offsets = np.linspace(0.0, duration_s - warmup_s, GRID_POINTS)
    spans = service_spans(records, cost)
    chosen = [c for c in (clients if clients is not None else spans) if c in spans]
    if len(chosen) < 2:
        return offsets + warmup_s, np.zeros_like(offsets)
    acc = accumulated_service({c: spans[c] for c in chosen}, offsets.tolist(), warmup_s)
    stacked = np.stack(
        [np.asarray(acc[c]) / (weights.get(c, 1.0) if weights else 1.0) for c in chosen]
    )
    return offsets + warmup_s, stacked.max(axis=0) - stacked.min(axis=0)


def service_difference_curve(
    records: Sequence[ResultRecord],
    duration_s: float,
    window_s: float,
    warmup_s: float,
    weights: Mapping[str, float] | None = None,
    cost: CostFunction = DEFAULT_COST,
) -> tuple[np.ndarray, np.ndarray]:
    """The service difference D (SPEC section 6) between the metrics' first and last
    ticks, sampled densely: window centres and D at each. Max/Avg Diff are taken over
    the 19 tick points of this curve."""
    step = (duration_s - warmup_s) / NUM_TICK_INTERVALS
    count = (NUM_TICK_INTERVALS - 2) * POINTS_PER_TICK + 1
    offsets = step * np.linspace(1.0, NUM_TICK_INTERVALS - 1.0, count)
    spans = service_spans(records, cost)
    ticks = offsets.tolist()
    service = service_rates(spans, ticks, window_s, warmup_s)
    demand = demand_rates(spans, ticks, window_s, warmup_s)
    values = service_difference(service, demand, weights) or [0.0] * count
    return offsets + warmup_s, np.asarray(values, dtype=float)


def busiest_clients(
    records: Sequence[ResultRecord], limit: int, cost: CostFunction = DEFAULT_COST
) -> list[str]:
    """The `limit` clients that received the most service."""
    demand: dict[str, float] = {}
    for rec in records:
        service = request_cost(cost, rec.input_tokens, rec.output_tokens)
        demand[rec.client] = demand.get(rec.client, 0.0) + service
    ranked = sorted(demand, key=lambda c: (-demand[c], c))
    return sorted(ranked[:limit], key=natural_key)


def service_in_interval(
    records: Sequence[ResultRecord],
    start_s: float,
    end_s: float,
    cost: CostFunction = DEFAULT_COST,
) -> dict[str, float]:
    """Service each client received within [start_s, end_s] (uniform spread, as the metrics)."""
    lo, hi = np.array([start_s]), np.array([end_s])
    spans = service_spans(records, cost)
    return {c: float(sp.service_between(lo, hi)[0]) for c, sp in spans.items()}


def natural_key(name: str) -> tuple[int | str, ...]:
    """Sort key putting client-2 before client-10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
