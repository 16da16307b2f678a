"""The per-tenant series the server and the gateway both expose, built one way for both.

`TenantMetrics` holds the request-level families of `metric_families` (tokens, service,
how requests ended, latencies), recorded on the event loop as requests go; the helpers
below build the live gauges (queues, counters, weights, groups) from what each process
knows at scrape time. So the two processes cannot drift apart in a name, a type or a
label, and one dashboard reads both.

A tenant removed from the tenants file is *retired*: its series stay while requests of
its are still waiting or running (they finish under the tenant they were admitted as),
and go at the first scrape after that, so /metrics lists only the tenants of the file
in force.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokenfair.edge import metric_families as families
from tokenfair.edge.histogram import LoopHistogram, LoopHistogramSeries
from tokenfair.edge.loop_counter import LoopCounter, LoopCounterSeries


def _counter(family: families.Family) -> LoopCounter:
    return LoopCounter(family.name, family.documentation, family.labels)


def _histogram(family: families.Family) -> LoopHistogram:
    return LoopHistogram(family.name, family.documentation, "tenant", family.buckets)


class TenantSeries:
    """One tenant's series, looked up once per tenant rather than per event."""

    __slots__ = (
        "_metrics",
        "e2e",
        "generation_tokens",
        "itl",
        "prompt_tokens",
        "queue",
        "service",
        "tenant",
        "ttft",
    )

    def __init__(self, metrics: TenantMetrics, tenant: str) -> None:
        self._metrics = metrics
        self.tenant = tenant
        self.prompt_tokens: LoopCounterSeries = metrics.prompt_tokens.labels(tenant)
        self.generation_tokens: LoopCounterSeries = metrics.generation_tokens.labels(tenant)
        self.service: LoopCounterSeries = metrics.service.labels(tenant)
        self.ttft: LoopHistogramSeries = metrics.ttft.labels(tenant)
        self.itl: LoopHistogramSeries = metrics.itl.labels(tenant)
        self.e2e: LoopHistogramSeries = metrics.e2e.labels(tenant)
        self.queue: LoopHistogramSeries = metrics.queue.labels(tenant)

    def succeeded(self, finished_reason: str) -> None:
        self._metrics.success.labels(self.tenant, finished_reason).inc()

    def rejected(self, reason: str) -> None:
        self._metrics.rejected.labels(self.tenant, reason).inc()

    def failed(self, reason: str) -> None:
        self._metrics.errors.labels(self.tenant, reason).inc()


class TenantMetrics:
    """The request-level families; a collector for a registry."""

    def __init__(self) -> None:
        self.prompt_tokens = _counter(families.PROMPT_TOKENS)
        self.generation_tokens = _counter(families.GENERATION_TOKENS)
        self.service = _counter(families.TENANT_SERVICE)
        self.success = _counter(families.REQUEST_SUCCESS)
        self.rejected = _counter(families.REQUESTS_REJECTED)
        self.errors = _counter(families.REQUEST_ERRORS)
        self.ttft = _histogram(families.TIME_TO_FIRST_TOKEN)
        self.itl = _histogram(families.INTER_TOKEN_LATENCY)
        self.e2e = _histogram(families.E2E_REQUEST_LATENCY)
        self.queue = _histogram(families.REQUEST_QUEUE_TIME)
        self._counters = (
            self.prompt_tokens,
            self.generation_tokens,
            self.service,
            self.success,
            self.rejected,
            self.errors,
        )
        self._histograms = (self.ttft, self.itl, self.e2e, self.queue)
        self._tenants: dict[str, TenantSeries] = {}
        self.known: set[str] = set()  # the tenants to report, with zeros until they send
        self.retired: set[str] = set()  # removed from the file; dropped once idle

    def of(self, tenant: str) -> TenantSeries:
        series = self._tenants.get(tenant)
        if series is None:
            series = self._tenants[tenant] = TenantSeries(self, tenant)
            self.known.add(tenant)
        return series

    def service_of(self) -> dict[str, float]:
        """Each tenant's weighted service so far."""
        return {values[0]: s.value for values, s in self.service.series.items()}

    # --- the tenants in force ---
    def tenants_now(self, names: Iterable[str]) -> None:
        """The tenants file in force names these: report them; retire the others."""
        names = set(names)
        self.retired |= self.known - names
        self.retired -= names
        self.known |= names

    def sweep(self, busy: Collection[str]) -> None:
        """Drop the series of retired tenants with nothing waiting or running (`busy`)."""
        for tenant in [t for t in self.retired if t not in busy]:
            self.retired.discard(tenant)
            self.known.discard(tenant)
            self._tenants.pop(tenant, None)
            for counter in self._counters:
                counter.remove_first(tenant)
            for histogram in self._histograms:
                histogram.remove(tenant)

    # --- the collector ---
    def describe(self) -> list[Metric]:
        return [m for family in (*self._counters, *self._histograms) for m in family.describe()]

    def collect(self) -> Iterator[Metric]:
        for family in (*self._counters, *self._histograms):
            yield from family.collect()


def _per_label(
    family: families.Family, tenants: Iterable[str], values: Mapping[str, float], default: float
) -> GaugeMetricFamily:
    gauge = family.gauge()
    for tenant in tenants:
        gauge.add_metric([tenant], float(values.get(tenant, default)))
    return gauge


def tenant_gauges(
    tenants: Iterable[str],
    waiting: Mapping[str, float],
    running: Mapping[str, float],
    counters: Mapping[str, float],
    weights: Mapping[str, float],
) -> Iterator[Metric]:
    """Per tenant (those given, sorted): its queues, its VTC counter and its weight."""
    names = sorted(tenants)
    yield _per_label(families.NUM_REQUESTS_WAITING, names, waiting, 0.0)
    yield _per_label(families.NUM_REQUESTS_RUNNING, names, running, 0.0)
    yield _per_label(families.VTC_COUNTER, names, counters, 0.0)
    yield _per_label(families.TENANT_WEIGHT, names, weights, 1.0)


def group_series(
    groups: Iterable[str],
    counters: Mapping[str, float],
    weights: Mapping[str, float],
    service: Mapping[str, float],
) -> Iterator[Metric]:
    """Per group (by path; none without groups): counter, weight, its tenants' service."""
    paths = sorted(groups)
    if not paths:
        return
    yield _per_label(families.GROUP_VTC_COUNTER, paths, counters, 0.0)
    yield _per_label(families.GROUP_WEIGHT, paths, weights, 1.0)
    total = CounterMetricFamily(
        families.GROUP_SERVICE.name, families.GROUP_SERVICE.documentation, labels=["group"]
    )
    for path in paths:
        total.add_metric([path], float(service.get(path, 0.0)))
    yield total


def build_info(role: str) -> GaugeMetricFamily:
    try:
        release = version("tokenfair")
    except PackageNotFoundError:  # run from a source tree without installing
        release = "unknown"
    gauge = families.BUILD_INFO.gauge()
    gauge.add_metric([role, release], 1.0)
    return gauge
