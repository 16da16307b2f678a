"""The gateway's Prometheus metrics: the server's per-tenant families (the same names,
types and labels, `edge/tenant_metrics.py`), and the gateway's own (upstreams, leases,
retries, routing).

Request-level series (tokens, latencies, how requests ended) are updated as requests
finish; gauges (queues, counters, upstream state) are read from the live objects at
scrape time, so the hot path never touches them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenfair.core.share_tree import is_group
from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.tenant_metrics import (
    TenantMetrics,
    TenantSeries,
    build_info,
    group_series,
    tenant_gauges,
)
from tokenfair.gateway.flow.admission import Admission
from tokenfair.gateway.replicas.counters import CounterStore
from tokenfair.gateway.upstreams.pool import UpstreamPool
from tokenfair.gateway.upstreams.routing_metrics import RoutingCollector

# The finish reasons an upstream may report (vLLM's and OpenAI's); any other is "other",
# so that a label cannot take unbounded values.
FINISH_REASONS = frozenset(
    ("stop", "length", "abort", "tool_calls", "content_filter", "function_call")
)
_ERROR_CODE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, as the metrics count it."""

    kind: str  # "success", "rejected" (a 4xx) or "error"
    label: str  # the finish reason, or the error code

    @classmethod
    def finished(cls, reason: Any) -> Outcome:
        """Answered: the upstream's finish reason (stop when it gives none)."""
        if reason is None:
            return cls("success", "stop")
        return cls("success", reason if reason in FINISH_REASONS else "other")

    @classmethod
    def answered(cls, status: int, code: Any) -> Outcome:
        """The upstream answered an error: a 4xx is a refusal, a 5xx an error; by its
        error code when it gives a plain one."""
        label = code if isinstance(code, str) and _ERROR_CODE.match(code) else f"http_{status}"
        return cls("rejected" if status < 500 else "error", label)


ABORTED = Outcome("success", "abort")  # the client went away (as vLLM counts it)


class _Live(Collector):
    def __init__(
        self,
        metrics: GatewayMetrics,
        admission: Admission,
        pool: UpstreamPool,
        stores: Mapping[int, CounterStore],
        directory: TenantDirectory,
    ) -> None:
        self.metrics = metrics
        self.admission = admission
        self.pool = pool
        self.stores = stores  # band -> its counters (none under the ordering policies)
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        yield build_info("gateway")
        admission, directory = self.admission, self.directory
        tenants = self.metrics.per_tenant.known | set(admission.waiting) | set(admission.running)
        nodes: dict[str, float] = {}
        for store in self.stores.values():
            nodes.update(store.counters())
        weights = directory.weights()
        yield from tenant_gauges(
            tenants,
            admission.waiting,
            admission.running,
            {t: c for t, c in nodes.items() if t in tenants},
            {t: weights.get(t, 1.0) for t in tenants},
        )
        groups = directory.groups
        service: dict[str, float] = dict.fromkeys(groups, 0.0)
        tree = directory.tree
        if groups:
            for tenant, amount in self.metrics.per_tenant.service_of().items():
                for node in tree.path(tenant)[:-1]:
                    if node[1:] in service:
                        service[node[1:]] += amount
        yield from group_series(
            groups,
            {n[1:]: c for n, c in nodes.items() if is_group(n) and n[1:] in groups},
            groups,
            service,
        )
        if self.stores:
            yield GaugeMetricFamily(
                "tokenfair:gateway_counters_degraded",
                "1 while Redis is unreachable and counters are local",
                value=float(any(store.degraded for store in self.stores.values())),
            )
        yield from self._upstreams()

    def _upstreams(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            "tokenfair:gateway_upstream_healthy",
            "1 when the upstream is in rotation",
            labels=["upstream"],
        )
        load = GaugeMetricFamily(
            "tokenfair:gateway_upstream_running",
            "Requests this replica has on the upstream",
            labels=["upstream"],
        )
        tokens = GaugeMetricFamily(
            "tokenfair:gateway_upstream_inflight_tokens",
            "Prompt + max_tokens this replica has in flight on the upstream",
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
        self,
        admission: Admission,
        pool: UpstreamPool,
        stores: Mapping[int, CounterStore],
        directory: TenantDirectory,
    ) -> None:
        disable_created_metrics()  # no *_created series, as the server and vLLM
        self.registry = CollectorRegistry()
        self.admission = admission
        self.per_tenant = TenantMetrics()
        self.per_tenant.tenants_now(t.name for t in directory.tenants)
        self.registry.register(self.per_tenant)
        self.retries = Counter(
            "tokenfair:gateway_retries",
            "Requests retried on another upstream",
            registry=self.registry,
        )
        self.registry.register(_Live(self, admission, pool, stores, directory))
        self.registry.register(RoutingCollector(pool))

    def of(self, tenant: str) -> TenantSeries:
        return self.per_tenant.of(tenant)

    def reject(self, tenant: str, reason: str) -> None:
        self.per_tenant.of(tenant).rejected(reason)

    def finished(
        self, tenant: str, outcome: Outcome, prompt: int, output: int, service: float, e2e: float
    ) -> None:
        series = self.per_tenant.of(tenant)
        series.prompt_tokens.inc(prompt)
        series.generation_tokens.inc(output)
        series.service.inc(service)
        if outcome.kind == "success":
            series.succeeded(outcome.label)
        elif outcome.kind == "rejected":
            series.rejected(outcome.label)
        else:
            series.failed(outcome.label)
        series.e2e.observe(e2e)

    def render(self) -> bytes:
        admission = self.admission
        self.per_tenant.sweep({*admission.waiting, *admission.running})
        return generate_latest(self.registry)
