"""The gateway's Prometheus metrics, named like the server's (`tokenfair:` + vLLM's names).

Request-level series (tokens, latencies) are updated as requests finish; gauges (queue,
running, counters, upstream state) are read from the live objects at scrape time, so
the hot path never touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
        self, admission: Admission, pool: UpstreamPool, store: Callable[[], CounterStore | None]
    ) -> None:
        self.admission = admission
        self.pool = pool
        self.store = store

    def collect(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily(
            "tokenfair:num_requests_waiting", "Requests waiting in the gateway", labels=["tenant"]
        )
        for tenant, n in self.admission.waiting.items():
            waiting.add_metric([tenant], n)
        running = GaugeMetricFamily(
            "tokenfair:num_requests_running",
            "Requests dispatched to an upstream",
            labels=["tenant"],
        )
        for tenant, n in self.admission.running.items():
            running.add_metric([tenant], n)
        yield waiting
        yield running
        store = self.store()
        if store is not None:
            counter = GaugeMetricFamily(
                "tokenfair:vtc_counter",
                "VTC counter per tenant (shared when in Redis)",
                labels=["tenant"],
            )
            for tenant, value in store.counters().items():
                counter.add_metric([tenant], value)
            yield counter
            yield GaugeMetricFamily(
                "tokenfair:gateway_counters_degraded",
                "1 while Redis is unreachable and counters are local",
                value=float(store.degraded),
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


class GatewayMetrics:
    def __init__(
        self, admission: Admission, pool: UpstreamPool, store: Callable[[], CounterStore | None]
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter(
            "tokenfair:prompt_tokens", "Prompt tokens served", ["tenant"], registry=r
        )
        self.generation_tokens = Counter(
            "tokenfair:generation_tokens", "Generated tokens served", ["tenant"], registry=r
        )
        self.service = Counter(
            "tokenfair:tenant_service",
            "Service received, w_in*in + w_out*out",
            ["tenant"],
            registry=r,
        )
        self.requests = Counter(
            "tokenfair:request_success",
            "Finished requests by outcome",
            ["tenant", "outcome"],
            registry=r,
        )
        self.rejected = Counter(
            "tokenfair:requests_rejected",
            "Requests refused before running (overload, rate limit, bad input).",
            ["tenant", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "tokenfair:gateway_retries", "Requests retried on another upstream", registry=r
        )
        self.ttft = Histogram(
            "tokenfair:time_to_first_token_seconds",
            "From arrival at the gateway to the first token",
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tokenfair:e2e_request_latency_seconds",
            "Arrival to last byte",
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "tokenfair:request_queue_time_seconds",
            "Time waiting in the gateway",
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_Live(admission, pool, store))
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
