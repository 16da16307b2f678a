"""Latency histograms observed on the event loop alone, exported as Prometheus histograms.

prometheus_client's Histogram takes a lock for each observation and then finds the
bucket in a Python loop. The server observes an inter-token latency for every token of
every stream (the gateway for every chunk), all on the event loop, so they count into
plain per-tenant lists instead
(`bisect` finds the bucket) and builds the usual `_bucket`/`_sum`/`_count` series only
when /metrics is scraped. Observe from one thread only; the scrape reads a consistent
enough view (a count may lead its sum by one observation, as with any lock-free read).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class LoopHistogramSeries:
    """One label value's buckets: counts per bucket (the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are "less than or equal": bisect_left puts a value equal to a
        # bound in that bound's bucket.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class LoopHistogram:
    """A histogram family with one label, e.g. per tenant; a collector for its registry."""

    def __init__(self, name: str, documentation: str, label: str, buckets: Sequence[float]) -> None:
        bounds = tuple(float(b) for b in buckets)
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram {name}: buckets must increase strictly, got {buckets}")
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = bounds
        self.series: dict[str, LoopHistogramSeries] = {}

    def labels(self, value: str) -> LoopHistogramSeries:
        series = self.series.get(value)
        if series is None:
            series = self.series[value] = LoopHistogramSeries(self.bounds)
        return series

    def remove(self, value: str) -> None:
        """Drop one label value's series (a tenant removed from the tenants file)."""
        self.series.pop(value, None)

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=[self.label])]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        edges = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for value, series in sorted(self.series.items()):
            cumulative, buckets = 0, []
            for edge, count in zip(edges, list(series.counts), strict=True):
                cumulative += count
                buckets.append((edge, cumulative))
            family.add_metric([value], buckets, series.sum)
        yield family
