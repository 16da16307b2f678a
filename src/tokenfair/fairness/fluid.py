"""The fluid fair-share ideal: what a perfectly fair server of the same capacity gives.

A run's fairness figures depend on how much it served: a policy that serves more can
show a larger service difference simply because every rate is larger. The reference
for a run is generalized processor sharing (GPS) at the run's own capacity: the same
requests arrive, each bringing its service (SPEC section 6's `s`), and every second
the ideal server delivers what the run delivered in that second (its capacity then,
which moves with the cache and the batch), divided among the clients with work in
proportion to their weights. It is a reference, not a bound: the ideal's Max Diff is
what GPS's own schedule shows in the windows (not zero, since they still see demand
arrive in bursts), and a policy that departs from GPS can show less (one favouring
clients back from idle measured 163.8 on the arena trace against its ideal's 226.5).
The service the run's clients are behind the ideal, summed, says how far the run is
from GPS at the throughput it reached.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tokenfair.core.cost import DEFAULT_COST, CostFunction, request_cost
from tokenfair.fairness.metrics import (
    NUM_TICK_INTERVALS,
    diff_stats,
    service_difference,
    weight_of,
)
from tokenfair.fairness.spans import (
    ClientSpans,
    accumulated_service,
    demand_rates,
    service_rates,
    service_spans,
    tick_times,
)
from tokenfair.results import ResultRecord


@dataclass(frozen=True, slots=True)
class FluidComparison:
    """A run against GPS at its own capacity, on the same ticks and windows."""

    max_diff: float  # the ideal's Max Diff at that capacity
    avg_diff: float
    # The most service the run's clients were behind the ideal at any tick, summed
    # over clients (each client's shortfall of accumulated service since the warm-up).
    max_shortfall: float


RESOLUTION_S = 1.0  # the ideal's capacity follows the run's, second by second


def capacity_curve(
    spans: Mapping[str, ClientSpans], start_s: float, end_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """(bin edges, service per second in each bin) the run delivered, over all clients."""
    bins = max(1, math.ceil((end_s - start_s) / RESOLUTION_S))
    edges = start_s + RESOLUTION_S * np.arange(bins + 1)
    total = np.zeros(bins)
    for sp in spans.values():
        total += sp.service_between(edges[:-1], edges[1:])
    return edges, total / RESOLUTION_S


def fluid_service_spans(
    records: Sequence[ResultRecord],
    weights: Mapping[str, float] | None = None,
    cost: CostFunction = DEFAULT_COST,
) -> dict[str, ClientSpans]:
    """Each client's service under GPS at the run's capacity, as spans of constant rate.

    The served requests arrive as in the run, each asking for the service it received;
    in each second the ideal delivers what the run delivered in it, less when fewer
    clients have work left than that.
    """
    served = [r for r in records if r.served]
    if not served:
        return {}
    edges, capacity = capacity_curve(
        service_spans(served, cost),
        min(r.arrival_s for r in served),
        max(r.finish_s for r in served if r.finish_s is not None),
    )
    arrivals = sorted(
        (r.arrival_s, r.client, request_cost(cost, r.input_tokens, r.output_tokens)) for r in served
    )
    backlog: dict[str, float] = {}
    segments: dict[str, list[tuple[float, float, float]]] = {}
    now, next_arrival, bin_index = arrivals[0][0], 0, 0
    while bin_index < len(capacity) and (next_arrival < len(arrivals) or backlog):
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= now:
            _, client, service = arrivals[next_arrival]
            backlog[client] = backlog.get(client, 0.0) + service
            next_arrival += 1
        bin_end = edges[bin_index + 1]
        until = min(bin_end, arrivals[next_arrival][0] if next_arrival < len(arrivals) else bin_end)
        rate = capacity[bin_index]
        if backlog and rate > 0:
            total_weight = sum(weight_of(weights, c) for c in backlog)
            rates = {c: rate * weight_of(weights, c) / total_weight for c in backlog}
            until = min(until, now + min(backlog[c] / rates[c] for c in backlog))
            for client, client_rate in rates.items():
                given = min(backlog[client], client_rate * (until - now))
                segments.setdefault(client, []).append((now, until, given))
                backlog[client] -= given
            for client in [c for c, left in backlog.items() if left <= 1e-9]:
                del backlog[client]
        now = until
        if now >= bin_end:
            bin_index += 1
    spans: dict[str, ClientSpans] = {}
    for client in sorted(segments):
        cols = np.array(segments[client], dtype=float).reshape(-1, 3)
        spans[client] = ClientSpans(cols[:, 0], cols[:, 0], cols[:, 1], cols[:, 2])
    return spans


def compare_with_fluid(
    records: Sequence[ResultRecord],
    *,
    duration_s: float,
    window_s: float,
    warmup_s: float,
    weights: Mapping[str, float] | None = None,
    cost: CostFunction = DEFAULT_COST,
) -> FluidComparison:
    """The run's fair-share ideal at its own capacity, on the report's ticks."""
    actual = service_spans(records, cost)
    fluid = fluid_service_spans(records, weights, cost)
    if not fluid:
        return FluidComparison(0.0, 0.0, 0.0)
    ticks = tick_times(duration_s, warmup_s, NUM_TICK_INTERVALS)
    demand = demand_rates(actual, ticks, window_s, warmup_s)
    stats = diff_stats(
        service_difference(service_rates(fluid, ticks, window_s, warmup_s), demand, weights)
    )
    ideal = accumulated_service(fluid, ticks, warmup_s)
    got = accumulated_service(actual, ticks, warmup_s)
    behind = np.zeros(len(ticks))
    for client, curve in ideal.items():
        behind += np.clip(np.asarray(curve) - np.asarray(got.get(client, 0.0)), 0.0, None)
    return FluidComparison(
        max_diff=stats["max_diff"],
        avg_diff=stats["avg_diff"],
        max_shortfall=float(behind.max()) if len(ticks) else 0.0,
    )
