"""Counters counted on the event loop alone, exported as Prometheus counters.

As `histogram.py` does for latencies: the server and the gateway count tokens and
finished requests on their event loop only, so each series is a plain number (no lock
per increment, as prometheus_client's Counter takes), and a tenant's series can be
dropped when the tenant is removed from the tenants file.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, Metric


class LoopCounterSeries:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopCounter:
    """A counter family; a collector for its registry. Its samples get `_total`."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.label_names = labels
        self.series: dict[tuple[str, ...], LoopCounterSeries] = {}

    def labels(self, *values: str) -> LoopCounterSeries:
        series = self.series.get(values)
        if series is None:
            series = self.series[values] = LoopCounterSeries()
        return series

    def remove_first(self, value: str) -> None:
        """Drop every series whose first label (the tenant, the group) is `value`."""
        for key in [k for k in self.series if k[0] == value]:
            del self.series[key]

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.label_names)]

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.label_names)
        for values, series in sorted(self.series.items()):
            family.add_metric(list(values), series.value)
        yield family
