"""The gateway's Prometheus metrics, named like the server's (`tokenfair:` + vLLM's names).

Request-level series (tokens, latencies) are updated as requests finish; gauges (queue,
running, counters, upstream state) are read from the live objects at scrape time, so
the hot path never touches them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenfair.core.share_tree import is_group
from tokenfair.edge import metric_families as families
from tokenfair.gateway.admission import Admission
from tokenfair.gateway.counters import CounterStore
from tokenfair.gateway.pool import UpstreamPool
from tokenfair.gateway.routing_metrics import RoutingCollector

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class TenantSeries:
    """One tenant's children of the request-level series, looked up once: `labels()`
    takes a lock and builds a tuple on every call, several times per request."""

    __slots__ = (
        "e2e",
        "generation_tokens",
        "outcomes",
        "prompt_tokens",
        "queue",
        "service",
        "ttft",
    )

    def __init__(self, metrics: GatewayMetrics, tenant: str) -> None:
        self.prompt_tokens = metrics.prompt_tokens.labels(tenant)
        self.generation_tokens = metrics.generation_tokens.labels(tenant)
        self.service = metrics.service.labels(tenant)
        self.ttft = metrics.ttft.labels(tenant)
        self.e2e = metrics.e2e.labels(tenant)
        self.queue = metrics.queue.labels(tenant)
        self.outcomes: dict[str, Counter] = {}


class _Live(Collector):
    def __init__(
        self, admission: Admission, pool: UpstreamPool, stores: Mapping[int, CounterStore]
    ) -> None:
        self.admission = admission
        self.pool = pool
        self.stores = stores  # band -> its counters (none under the ordering policies)

    def collect(self) -> Iterator[Metric]:
        waiting = families.NUM_REQUESTS_WAITING.gauge()
        for tenant, n in self.admission.waiting.items():
            waiting.add_metric([tenant], n)
        running = families.NUM_REQUESTS_RUNNING.gauge()
        for tenant, n in self.admission.running.items():
            running.add_metric([tenant], n)
        yield waiting
        yield running
        stores = list(self.stores.values())
        if stores:
            counter = families.VTC_COUNTER.gauge()
            groups = families.GROUP_VTC_COUNTER.gauge()
            for store in stores:
                for node, value in store.counters().items():
                    if is_group(node):
                        groups.add_metric([node[1:]], value)
                    else:
                        counter.add_metric([node], value)
            yield counter
            yield groups
            yield GaugeMetricFamily(
                "tokenfair:gateway_counters_degraded",
                "1 while Redis is unreachable and counters are local",
                value=float(any(store.degraded for store in stores)),
            )
        healthy = GaugeMetricFamily(
            "tokenfair:gateway_upstream_healthy",
            "1 when the upstream is in rotation",
            labels=["upstream"],
        )
        load = GaugeMetricFamily(
            "tokenfair:gateway_upstream_running",
            "Requests the gateway has on the upstream",
            labels=["upstream"],
        )
        tokens = GaugeMetricFamily(
            "tokenfair:gateway_upstream_inflight_tokens",
            "Prompt + max_tokens in flight",
            labels=["upstream"],
        )
        for upstream in self.pool.upstreams:
            healthy.add_metric([upstream.name], float(upstream.healthy))
            load.add_metric([upstream.name], upstream.running)
            tokens.add_metric([upstream.name], upstream.inflight_tokens)
        yield healthy
        yield load
        yield tokens
        leased = [u for u in self.pool.upstreams if u.lease is not None]
        if leased:
            slots = GaugeMetricFamily(
                "tokenfair:gateway_upstream_lease",
                "Requests this replica may have on the upstream (its lease of the capacity "
                "the replicas share)",
                labels=["upstream"],
            )
            budget = GaugeMetricFamily(
                "tokenfair:gateway_upstream_lease_tokens",
                "In-flight tokens this replica may hold on the upstream (its lease)",
                labels=["upstream"],
            )
            for upstream in leased:
                assert upstream.lease is not None
                slots.add_metric([upstream.name], upstream.lease.slots)
                budget.add_metric([upstream.name], upstream.lease.tokens)
            yield slots
            yield budget


class GatewayMetrics:
    def __init__(
        self, admission: Admission, pool: UpstreamPool, stores: Mapping[int, CounterStore]
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = families.PROMPT_TOKENS.counter(r)
        self.generation_tokens = families.GENERATION_TOKENS.counter(r)
        # A counter here, a gauge read from the engine in the server.
        self.service = families.TENANT_SERVICE.counter(r)
        # Labelled by the gateway's outcome (ok, abort, timeout, upstream_error, http_NNN)
        # rather than the engine's finish reason, which the gateway does not see.
        self.requests = families.REQUEST_SUCCESS.counter(r, ("tenant", "outcome"))
        self.rejected = families.REQUESTS_REJECTED.counter(r)
        self.retries = Counter(
            "tokenfair:gateway_retries", "Requests retried on another upstream", registry=r
        )
        self.ttft = Histogram(
            families.TIME_TO_FIRST_TOKEN.name,
            families.TIME_TO_FIRST_TOKEN.documentation,
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            families.E2E_REQUEST_LATENCY.name,
            families.E2E_REQUEST_LATENCY.documentation,
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            families.REQUEST_QUEUE_TIME.name,
            families.REQUEST_QUEUE_TIME.documentation,
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_Live(admission, pool, stores))
        r.register(RoutingCollector(pool))
        self._tenants: dict[str, TenantSeries] = {}

    def of(self, tenant: str) -> TenantSeries:
        series = self._tenants.get(tenant)
        if series is None:
            series = self._tenants[tenant] = TenantSeries(self, tenant)
        return series

    def finished(
        self, tenant: str, outcome: str, prompt: int, output: int, service: float, e2e: float
    ) -> None:
        series = self.of(tenant)
        series.prompt_tokens.inc(prompt)
        series.generation_tokens.inc(output)
        series.service.inc(service)
        counter = series.outcomes.get(outcome)
        if counter is None:
            counter = series.outcomes[outcome] = self.requests.labels(tenant, outcome)
        counter.inc()
        series.e2e.observe(e2e)

    def render(self) -> bytes:
        return generate_latest(self.registry)
