"""VTC's fairness bound (SPEC section 3) and the accumulated service difference it limits.

For the linear cost, the counters of backlogged clients never differ by more than
`B = max(w_in * L_in, w_out * M)`, where `L_in` is the longest prompt and `M` the most
tokens the batch can hold (the KV pool, in tokens); two clients backlogged over an
interval receive service within `2 B` of each other.

The accumulated service difference is sampled on the figures' dense grid (from the end
of warm-up to T), not only at the metrics' 19 ticks, so a peak between two ticks is not
missed when it is compared with the bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tokenfair.core.cost import DEFAULT_COST, CostFunction, LinearCost
from tokenfair.fairness.curves import accumulated_difference_curve
from tokenfair.results import ResultRecord
from tokenfair.workloads.trace import TraceRecord

BACKLOGGED = "backlogged clients"
ALL_SERVED = "all served clients"


def service_bound(
    records: Iterable[TraceRecord], kv_tokens: int, cost: LinearCost = DEFAULT_COST
) -> float:
    """B = max(w_in * L_in, w_out * M) for a workload served with a `kv_tokens` pool."""
    longest_prompt = max((r.input_tokens for r in records), default=0)
    return max(cost.w_in * longest_prompt, cost.w_out * kv_tokens)


@dataclass(frozen=True, slots=True)
class ServiceDifference:
    """Accumulated service difference of one run over time, and the clients it covers."""

    times: np.ndarray
    values: np.ndarray
    scope: str  # BACKLOGGED or ALL_SERVED

    @property
    def peak(self) -> float:
        return float(self.values.max()) if self.values.size else 0.0

    @property
    def final(self) -> float:
        return float(self.values[-1]) if self.values.size else 0.0


def accumulated_difference(
    records: Sequence[ResultRecord],
    backlogged: Sequence[str],
    duration_s: float,
    warmup_s: float,
    weights: Mapping[str, float] | None = None,
    cost: CostFunction = DEFAULT_COST,
) -> ServiceDifference:
    """The curve the bound speaks about: over the clients backlogged (nearly) throughout
    when there are two or more of them, else over every served client (the artifact's
    curve, which then also counts clients that simply asked for less)."""
    clients = list(backlogged) if len(backlogged) >= 2 else None
    return difference_among(records, clients, duration_s, warmup_s, weights, cost)


def difference_among(
    records: Sequence[ResultRecord],
    clients: Sequence[str] | None,
    duration_s: float,
    warmup_s: float,
    weights: Mapping[str, float] | None = None,
    cost: CostFunction = DEFAULT_COST,
) -> ServiceDifference:
    """The accumulated service difference among `clients` (backlogged ones), or among
    every served client when None: to compare runs over one set of clients."""
    times, values = accumulated_difference_curve(
        records, clients, duration_s, warmup_s, weights, cost
    )
    return ServiceDifference(times, values, BACKLOGGED if clients else ALL_SERVED)
