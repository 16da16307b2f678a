"""Fairness metrics of a replay, as defined in SPEC section 6 and the paper's artifact.

All functions take the per-request results of one run (tokenfair.results) and the
measurement parameters: the cost (tokenfair.core.cost; default w_in = 1, w_out = 2),
`duration_s` (T: by default the last arrival), `window_s` (w, default 60), `warmup_s`
(default 30) and optional client `weights`. `tokenfair.fairness.report` gathers them
into one typed `FairnessReport`.

Service difference (the paper's Table of Max/Avg Diff):

    ticks x_i = (T - warmup) / 20 * i, i = 1..19
    window(x) = [x - w/2 + warmup, x + w/2 + warmup]
    y_j(x) = service of client j inside window(x) / w        (service rate)
    r_j(x) = service asked by j's requests arriving in window(x) / w   (demand rate)
    D(x) = sum_j min(max_k y_k(x) - y_j(x), |r_j(x) - y_j(x)|)

Max Diff / Avg Diff / Diff Var are the max, mean and population variance of D over the
ticks. The `|r - y|` term means a client that received what it asked for is not counted
as under-served. These agree to the printed digits with the artifact's
`fair_bench/plot/plot_revision.py` + `visualize.py` on the paper's own result files
(e.g. FCFS on the real trace: 759.97 / 433.53 / 32112.00 / 777 tok/s). Rejected
requests, and requests aborted before their first token, add neither service nor
demand (the artifact drops them first), so rate limiting is not punished by D: read D
together with throughput.

Accumulated service difference (the paper's "Absolute Difference in Service" figures
for the overload suites): with A_j(x) = service of client j in [warmup, x + warmup],

    acc_diff(x) = max_j A_j(x) - min_j A_j(x)

over a set of clients. The artifact takes every client with served requests; in the
paper's overload suites all clients are backlogged throughout, so that is the set of
backlogged clients. The report gives both: over all served clients (the artifact's
curve) and over the clients backlogged (nearly) throughout the measurement interval
(`backlog_fractions` >= BACKLOG_FRACTION): the quantity VTC bounds by
2 * max(w_in L_in, w_out M).

Jain's fairness index (sum x)^2 / (n sum x^2) is taken over x_j = service_j / weight_j
of the clients backlogged over an interval, whose fair shares are equal by definition
(Jain's x = actual / fair allocation). Clients that wait only now and then are left
out: they are served what they ask for, and counting them would call that unfair. It is
reported for the whole measurement interval [warmup, T] and per tick window; on a real
trace few clients stay backlogged for all of [warmup, T], so the per-tick figures (and
their mean and minimum) are the informative ones.

Where tokenfair goes beyond the artifact (all optional, defaults reproduce it):

- `weights`: rates and accumulated service are divided by the client's weight before
  differences are taken (weighted fairness: service in proportion to weight is "equal");
- `cost`: another service function (e.g. the profiled cost h(x, y)); it is used for
  both service and demand, whereas the artifact always prices demand linearly;
- throughput's wall time is last finish minus first arrival (SPEC); the artifact
  divides by its benchmark's own elapsed time, which differs from it by milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from tokenfair.fairness.spans import ClientSpans, backlogged_time, waiting_intervals
from tokenfair.results import ResultRecord

DEFAULT_WINDOW_S = 60.0
DEFAULT_WARMUP_S = 30.0
NUM_TICK_INTERVALS = 20
# A client counts as backlogged over an interval when it had a request waiting for at
# least this fraction of it: "nearly continuously", the paper's notion of a client
# backlogged over [t1, t2). A looser threshold (say 0.5) misreads a light client whose
# every request waits a few seconds for the next admission round as under-served.
BACKLOG_FRACTION = 0.95
TTFT_PERCENTILES = (50, 90, 99)


def weight_of(weights: Mapping[str, float] | None, client: str) -> float:
    """A client's weight (1 when no weights are given or the client has none)."""
    return 1.0 if weights is None else float(weights.get(client, 1.0))


def _normalised(
    curves: Mapping[str, Sequence[float]], weights: Mapping[str, float] | None
) -> dict[str, np.ndarray]:
    return {c: np.asarray(v, dtype=float) / weight_of(weights, c) for c, v in curves.items()}


def service_difference(
    service: Mapping[str, Sequence[float]],
    demand: Mapping[str, Sequence[float]],
    weights: Mapping[str, float] | None = None,
) -> list[float]:
    """D(x) per tick from service rates y and demand rates r (same clients, same ticks)."""
    if not service:
        return []
    y = np.stack(list(_normalised(service, weights).values()))
    norm_demand = _normalised(demand, weights)
    r = np.stack([norm_demand[c] for c in service])
    shortfall = y.max(axis=0, keepdims=True) - y
    return np.minimum(shortfall, np.abs(r - y)).sum(axis=0).tolist()


def diff_stats(diffs: Sequence[float]) -> dict[str, float]:
    """Max, mean and population variance of the service difference over the ticks."""
    if len(diffs) == 0:
        return {"max_diff": 0.0, "avg_diff": 0.0, "diff_var": 0.0}
    values = np.asarray(diffs, dtype=float)
    return {
        "max_diff": float(values.max()),
        "avg_diff": float(values.mean()),
        "diff_var": float(values.var()),
    }


def throughput(records: Sequence[ResultRecord]) -> float:
    """Input + output tokens of served requests / (last finish - first arrival), tok/s."""
    finishes = [r.finish_s for r in records if r.finish_s is not None]
    if not records or not finishes:
        return 0.0
    wall = max(finishes) - min(r.arrival_s for r in records)
    tokens = sum(r.input_tokens + r.output_tokens for r in records if r.served)
    return tokens / wall if wall > 0 else 0.0


def accumulated_service_difference(
    accumulated: Mapping[str, Sequence[float]],
    clients: Iterable[str] | None = None,
    weights: Mapping[str, float] | None = None,
) -> list[float]:
    """max_j A_j(x) - min_j A_j(x) per tick over `clients` (default: all given)."""
    chosen = list(accumulated) if clients is None else [c for c in clients if c in accumulated]
    if len(chosen) < 2:
        return [0.0] * len(next(iter(accumulated.values()), []))
    norm = _normalised({c: accumulated[c] for c in chosen}, weights)
    a = np.stack(list(norm.values()))
    return (a.max(axis=0) - a.min(axis=0)).tolist()


def backlog_fractions(
    records: Iterable[ResultRecord], start_s: float, end_s: float
) -> dict[str, float]:
    """Per client, the fraction of [start_s, end_s] with at least one request waiting."""
    span = end_s - start_s
    if span <= 0:
        raise ValueError(f"empty interval [{start_s}, {end_s}]")
    return {
        client: backlogged_time(intervals, start_s, end_s) / span
        for client, intervals in sorted(waiting_intervals(records).items())
    }


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 = equal, 1/n = one takes all.

    None for an empty sequence; 1.0 when every value is zero (nobody got more).
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None
    square_sum = float((x * x).sum())
    if square_sum == 0:
        return 1.0
    return float(x.sum() ** 2 / (x.size * square_sum))


def ttft_percentiles(records: Iterable[ResultRecord]) -> dict[str, dict[str, float | None]]:
    """Per client (and "*" for all), TTFT from arrival: p50/p90/p99 and mean, seconds."""
    samples: dict[str, list[float]] = {}
    for rec in records:
        samples.setdefault(rec.client, [])
        if rec.ttft_s is not None:
            samples[rec.client].append(rec.ttft_s)
    samples["*"] = [t for client in list(samples) for t in samples[client]]
    out: dict[str, dict[str, float | None]] = {}
    for client in sorted(samples):
        values = np.asarray(samples[client], dtype=float)
        stats: dict[str, float | None] = {
            f"p{p}": (float(np.percentile(values, p)) if values.size else None)
            for p in TTFT_PERCENTILES
        }
        stats["mean"] = float(values.mean()) if values.size else None
        out[client] = stats
    return out


def request_counts(records: Iterable[ResultRecord]) -> dict[str, dict[str, int]]:
    """Per client: total requests, served (got a first token), and by finish reason."""
    keys = ("total", "served", "stop", "length", "abort", "rejected", "unfinished")
    counts: dict[str, dict[str, int]] = {}
    for rec in records:
        c = counts.setdefault(rec.client, dict.fromkeys(keys, 0))
        c["total"] += 1
        c["served"] += rec.served
        c[rec.finish_reason or "unfinished"] += 1
    return {client: counts[client] for client in sorted(counts)}


def service_totals(spans: Mapping[str, ClientSpans]) -> dict[str, float]:
    """Total service each client received over the whole run."""
    return {c: float(sp.service.sum()) for c, sp in spans.items()}


def service_shares(totals: Mapping[str, float]) -> dict[str, float]:
    """Each client's fraction of all service delivered."""
    grand = sum(totals.values())
    return {c: (v / grand if grand > 0 else 0.0) for c, v in totals.items()}
