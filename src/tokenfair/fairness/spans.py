"""Service, demand and backlog of each client over time, from per-request results.

These are the curves the fairness metrics (tokenfair.fairness.metrics) are built from,
following the paper's artifact (VTC-artifact, fair_bench/plot/visualize.py):

- a served request's service `s = request_cost(cost, input_tokens, output_tokens)`
  (tokenfair.core.cost; by default `w_in * input + w_out * output`, output = tokens
  actually generated) is spread
  uniformly over [first_token_s, finish_s];
- its demand is the same `s`, placed at its arrival time;
- a request is *waiting* (its client is backlogged) from its arrival until it is first
  admitted: `scheduled_s`, or `first_token_s` when the result does not record admission
  (the paper's own results don't), or `finish_s` if it ended without being admitted.

Only served requests (those with a first token and a finish time) give service or
demand: a rejected request, or one aborted before its first token, adds nothing, exactly
as the artifact drops every response whose `first_token_latency` is -1 before computing
anything. A request aborted after its first token counts with the tokens it produced.

Two details where tokenfair follows the SPEC rather than the artifact's code (neither
changes any figure on the paper's results, where they never occur):

- a request whose first token and finish coincide (one output token; a point in time)
  delivers all its service at that instant (counted in the window holding it); the
  artifact skips requests served in under 10 microseconds;
- requests finishing before t = 1 s count like any other; the artifact skips them
  (a guard against its warm-up requests).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tokenfair.core.cost import DEFAULT_COST, CostFunction, request_cost
from tokenfair.results import ResultRecord


@dataclass(frozen=True, slots=True)
class ClientSpans:
    """Arrays over one client's served requests (same index = same request)."""

    arrival: np.ndarray  # arrival time
    start: np.ndarray  # first token time: service begins
    end: np.ndarray  # finish time: service ends
    service: np.ndarray  # total service of the request

    def service_between(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Service received in each window [lo[k], hi[k]] (uniform spread, point masses)."""
        if self.service.size == 0:
            return np.zeros(np.shape(lo))
        start, end, service = self.start[:, None], self.end[:, None], self.service[:, None]
        lo, hi = np.asarray(lo, dtype=float)[None, :], np.asarray(hi, dtype=float)[None, :]
        length = end - start
        overlap = np.clip(np.minimum(hi, end) - np.maximum(lo, start), 0.0, None)
        spread = np.divide(overlap, length, out=np.zeros_like(overlap), where=length > 0)
        # A zero-length service interval is an instant: all of it lands in the window
        # that holds it (half-open, so adjacent windows never count it twice).
        instant = (length <= 0) & (start >= lo) & (start < hi)
        return (service * np.where(length > 0, spread, instant)).sum(axis=0)

    def demand_between(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Service asked for by requests arriving in each window [lo[k], hi[k]] (closed)."""
        if self.service.size == 0:
            return np.zeros(np.shape(lo))
        arrival = self.arrival[:, None]
        lo, hi = np.asarray(lo, dtype=float)[None, :], np.asarray(hi, dtype=float)[None, :]
        inside = (arrival >= lo) & (arrival <= hi)
        return (self.service[:, None] * inside).sum(axis=0)


def service_spans(
    records: Iterable[ResultRecord], cost: CostFunction = DEFAULT_COST
) -> dict[str, ClientSpans]:
    """Per-client arrays of the served requests, clients in sorted order.

    Clients none of whose requests were served are absent, as in the artifact (which
    builds its client list after dropping unserved responses).
    """
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    for rec in records:
        if rec.first_token_s is None or rec.finish_s is None:
            continue
        s = request_cost(cost, rec.input_tokens, rec.output_tokens)
        rows.setdefault(rec.client, []).append((rec.arrival_s, rec.first_token_s, rec.finish_s, s))
    spans: dict[str, ClientSpans] = {}
    for client in sorted(rows):
        cols = np.array(rows[client], dtype=float).reshape(-1, 4)
        spans[client] = ClientSpans(cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3])
    return spans


def tick_times(duration_s: float, warmup_s: float, num_intervals: int = 20) -> list[float]:
    """The artifact's ticks: x_i = (T - warmup) / n * i for i = 1 .. n-1."""
    step = (duration_s - warmup_s) / num_intervals
    return [step * i for i in range(1, num_intervals)]


def tick_windows(
    ticks: Sequence[float], window_s: float, warmup_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Window edges per tick: [x - w/2 + warmup, x + w/2 + warmup]."""
    x = np.asarray(ticks, dtype=float)
    return x - window_s / 2 + warmup_s, x + window_s / 2 + warmup_s


def service_rates(
    spans: dict[str, ClientSpans], ticks: Sequence[float], window_s: float, warmup_s: float
) -> dict[str, list[float]]:
    """Service rate y_j(x): service of j overlapping the tick's window, divided by w."""
    lo, hi = tick_windows(ticks, window_s, warmup_s)
    return {c: (sp.service_between(lo, hi) / window_s).tolist() for c, sp in spans.items()}


def demand_rates(
    spans: dict[str, ClientSpans], ticks: Sequence[float], window_s: float, warmup_s: float
) -> dict[str, list[float]]:
    """Demand rate r_j(x): service of j's requests arriving in the window, divided by w."""
    lo, hi = tick_windows(ticks, window_s, warmup_s)
    return {c: (sp.demand_between(lo, hi) / window_s).tolist() for c, sp in spans.items()}


def accumulated_service(
    spans: dict[str, ClientSpans], ticks: Sequence[float], warmup_s: float
) -> dict[str, list[float]]:
    """Service of each client from warmup up to x + warmup, for each tick x."""
    hi = np.asarray(ticks, dtype=float) + warmup_s
    lo = np.full_like(hi, warmup_s)
    return {c: sp.service_between(lo, hi).tolist() for c, sp in spans.items()}


def waiting_intervals(records: Iterable[ResultRecord]) -> dict[str, list[tuple[float, float]]]:
    """Per client, each request's [arrival, admission) interval; open-ended if never."""
    out: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        admitted = next(
            (t for t in (rec.scheduled_s, rec.first_token_s, rec.finish_s) if t is not None),
            float("inf"),
        )
        out.setdefault(rec.client, []).append((rec.arrival_s, admitted))
    return out


def backlogged_time(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of [lo, hi] during which at least one interval is open (their union)."""
    total, reach = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total
