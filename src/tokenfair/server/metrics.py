"""Prometheus metrics, vLLM's names under a `tokenfair:` prefix, with a `tenant` label.

Two sources. Events (tokens, latencies, finishes) are recorded on the event loop from
each engine step's outputs, aggregated per step so the cost does not grow with every
token. State (running, waiting, KV usage, preemptions, VTC counters) is read from the
scheduler at scrape time, on the engine thread between two steps (a `Snapshot`), so
it is exact and costs nothing between scrapes.

Latencies are in engine time: arrival, first token and finish are stamped by the
engine's clock when the step that produced them ends.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokenfair.core.cost import LinearCost
from tokenfair.core.request import FinishReason, Request
from tokenfair.core.share_tree import ShareTree, group_id, is_group
from tokenfair.edge import metric_families as families
from tokenfair.engine.engine import Engine, RequestOutput
from tokenfair.server.histogram import LoopHistogram

RECENT_REQUESTS = 2048  # finished requests kept for GET /admin/requests/recent
LATENCY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip


@dataclass(slots=True)
class Snapshot:
    """The scheduler's state between two steps."""

    running: Counter[str] = field(default_factory=Counter)
    waiting: Counter[str] = field(default_factory=Counter)
    swapped: Counter[str] = field(default_factory=Counter)
    preemptions: dict[str, int] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    group_counters: dict[str, float] = field(default_factory=dict)  # group path -> counter
    weights: dict[str, float] = field(default_factory=dict)  # tenants, and groups as @path
    kv_used_blocks: int = 0
    kv_blocks: int = 1
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    num_steps: int = 0

    @classmethod
    def take(cls, engine: Engine) -> Snapshot:
        """Run on the engine thread (AsyncEngine.call)."""
        scheduler = engine.scheduler
        policy = scheduler.policy
        counters = getattr(policy, "counters", None)
        nodes = getattr(policy, "node_counters", None)
        all_nodes: dict[str, float] = nodes() if callable(nodes) else {}
        kv = scheduler.kv
        return cls(
            running=Counter(r.client for r in scheduler.running),
            waiting=Counter(r.client for r in policy.waiting_requests()),
            swapped=Counter(r.client for r in scheduler.swapped),
            preemptions=dict(scheduler.preemptions_by_client),
            counters=counters() if callable(counters) else {},
            group_counters={n[1:]: c for n, c in all_nodes.items() if is_group(n)},
            weights=dict(getattr(policy, "weights", {}) or {}),
            kv_used_blocks=kv.num_used_blocks,
            kv_blocks=kv.num_blocks,
            prefix_hit_tokens=kv.prefix_hit_tokens,
            prefix_query_tokens=kv.prefix_query_tokens,
            num_steps=engine.num_steps,
        )


class ServerMetrics:
    def __init__(self, cost: LinearCost | None = None) -> None:
        disable_created_metrics()  # no *_created series, as vLLM does
        self.registry = CollectorRegistry(auto_describe=True)
        self.cost = cost or LinearCost()
        registry = self.registry
        self.prompt_tokens = families.PROMPT_TOKENS.counter(registry)
        self.generation_tokens = families.GENERATION_TOKENS.counter(registry)
        self.finished = families.REQUEST_SUCCESS.counter(registry)
        self.rejected = families.REQUESTS_REJECTED.counter(registry)
        self.backpressure = PromCounter(
            "tokenfair:stream_backpressure",
            "Times a streamed token found its client's socket full (the client reads slower "
            "than tokens come): the token waited in the server, the engine did not.",
            ["tenant"],
            registry=registry,
        )
        self.ttft = LoopHistogram(
            families.TIME_TO_FIRST_TOKEN.name,
            families.TIME_TO_FIRST_TOKEN.documentation,
            "tenant",
            LATENCY_BUCKETS,
        )
        registry.register(self.ttft)
        self.itl = LoopHistogram(
            "tokenfair:inter_token_latency_seconds",
            "Time between two tokens of one request.",
            "tenant",
            TOKEN_LATENCY_BUCKETS,
        )
        registry.register(self.itl)
        self.e2e = LoopHistogram(
            families.E2E_REQUEST_LATENCY.name,
            families.E2E_REQUEST_LATENCY.documentation,
            "tenant",
            LATENCY_BUCKETS,
        )
        registry.register(self.e2e)
        self.service: dict[str, float] = {}  # weighted tokens received, per tenant
        self.known_tenants: set[str] = set()
        self.tree = ShareTree()  # the tenants' groups, for the per-group series
        self.snapshot = Snapshot()
        self._by_tenant: dict[str, tuple[Any, Any, Any, Any, Any]] = {}
        self._finished_by: dict[tuple[str, str], Any] = {}
        self._last_token_s: dict[str, float] = {}  # request id -> engine time of its last token
        self._arrival_step: dict[str, int] = {}
        self._first_step: dict[str, tuple[int, float]] = {}  # step and hand-over time
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)
        registry.register(_SnapshotCollector(self))

    def tenants(self, names: Iterable[str]) -> None:
        """Tenants to report even before they send anything (zeros, not absent series)."""
        self.known_tenants.update(names)

    def reject(self, tenant: str, reason: str) -> None:
        self.rejected.labels(tenant, reason).inc()

    def _children(self, tenant: str) -> tuple[Any, Any, Any, Any, Any]:
        """The tenant's labelled series, looked up once (labels() takes a lock each call)."""
        children = self._by_tenant.get(tenant)
        if children is None:
            self.known_tenants.add(tenant)
            children = self._by_tenant[tenant] = (
                self.ttft.labels(tenant),
                self.itl.labels(tenant),
                self.e2e.labels(tenant),
                self.prompt_tokens.labels(tenant),
                self.generation_tokens.labels(tenant),
            )
        return children

    def _finished_series(self, tenant: str, reason: str) -> Any:
        series = self._finished_by.get((tenant, reason))
        if series is None:
            series = self._finished_by[tenant, reason] = self.finished.labels(tenant, reason)
        return series

    def arrived(self, request_id: str, step: int) -> None:
        """Note the engine's step count when a request was submitted."""
        self._arrival_step[request_id] = step

    def on_step(self, outputs: list[RequestOutput], now: float, step: int = 0) -> None:
        """Record one engine step's outputs (called on the loop before streams see them)."""
        last = self._last_token_s
        generated: dict[str, int] = {}
        w_in, w_out = self.cost.w_in, self.cost.w_out
        service = self.service
        for output in outputs:
            request = output.request
            tenant = request.client
            rid = request.request_id
            ttft, itl, e2e, prompt_tokens, _ = self._children(tenant)
            n = len(output.new_token_ids)
            if n:
                generated[tenant] = generated.get(tenant, 0) + n
                previous = last.get(rid)
                if previous is None:
                    self._first_step[rid] = (step, now)
                    first = request.first_token_s if request.first_token_s is not None else now
                    ttft.observe(first - request.arrival_s)
                    prompt_tokens.inc(request.input_tokens)
                    service[tenant] = service.get(tenant, 0.0) + w_in * request.input_tokens
                else:
                    itl.observe(now - previous)
                last[rid] = now
            if output.finished:
                last.pop(rid, None)
                self._log_finished(request, now, step)
                reason = request.finish_reason
                if reason is not FinishReason.REJECTED:
                    label = reason.value if reason is not None else "abort"
                    self._finished_series(tenant, label).inc()
                    finish = request.finish_s if request.finish_s is not None else now
                    e2e.observe(finish - request.arrival_s)
        for tenant, n in generated.items():
            self._children(tenant)[4].inc(n)
            service[tenant] = service.get(tenant, 0.0) + w_out * n

    def _log_finished(self, request: Request, now: float, step: int) -> None:
        rid = request.request_id
        arrival_step = self._arrival_step.pop(rid, None)
        first_step_and_time = self._first_step.pop(rid, None)
        first = request.first_token_s
        first_step, first_handed_over = first_step_and_time or (None, None)
        self.recent.append(
            {
                "id": rid,
                "tenant": request.client,
                "finish_reason": request.finish_reason.value if request.finish_reason else None,
                "prompt_tokens": request.input_tokens,
                "completion_tokens": len(request.output_token_ids),
                "preemptions": request.preemptions,
                "ttft_s": None if first is None else first - request.arrival_s,
                "e2e_s": (request.finish_s if request.finish_s is not None else now)
                - request.arrival_s,
                # Until the engine handed the token over, after the step's bookkeeping
                # (an offline run waits for that too): where the server's share begins.
                "ttft_handed_over_s": None
                if first_handed_over is None
                else first_handed_over - request.arrival_s,
                "e2e_handed_over_s": now - request.arrival_s,
                # Engine steps from submission to the first token: TTFT in the engine's
                # own terms, free of wall-clock noise on a busy machine.
                "ttft_steps": None
                if arrival_step is None or first_step is None
                else first_step - arrival_step,
            }
        )

    def render(self, snapshot: Snapshot) -> bytes:
        self.snapshot = snapshot
        return generate_latest(self.registry)


class _SnapshotCollector:
    """Scheduler state as gauges (and the preemption counter) at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        metrics = self.metrics
        snap = metrics.snapshot
        tenants = sorted(
            metrics.known_tenants
            | set(snap.running)
            | set(snap.waiting)
            | set(snap.counters)
            | set(metrics.service)
        )

        def per_tenant(family: GaugeMetricFamily | CounterMetricFamily, values: dict) -> Metric:
            for tenant in tenants:
                family.add_metric([tenant], float(values.get(tenant, 0)))
            return family

        yield per_tenant(families.NUM_REQUESTS_RUNNING.gauge(), snap.running)
        yield per_tenant(families.NUM_REQUESTS_WAITING.gauge(), snap.waiting)
        yield per_tenant(
            GaugeMetricFamily(
                "tokenfair:num_requests_swapped",
                "Requests swapped out to host memory.",
                labels=["tenant"],
            ),
            snap.swapped,
        )
        yield per_tenant(
            CounterMetricFamily(
                "tokenfair:num_preemptions", "Requests preempted.", labels=["tenant"]
            ),
            snap.preemptions,
        )
        yield per_tenant(families.VTC_COUNTER.gauge(), snap.counters)
        yield per_tenant(families.TENANT_SERVICE.gauge(), metrics.service)
        yield per_tenant(
            families.TENANT_WEIGHT.gauge(), {t: snap.weights.get(t, 1.0) for t in tenants}
        )
        yield from _group_series(metrics, snap)
        usage = GaugeMetricFamily("tokenfair:kv_cache_usage_perc", "KV cache usage (1 = full).")
        usage.add_metric([], snap.kv_used_blocks / max(1, snap.kv_blocks))
        yield usage
        used = GaugeMetricFamily("tokenfair:kv_cache_used_blocks", "KV blocks held by requests.")
        used.add_metric([], snap.kv_used_blocks)
        yield used
        hits = CounterMetricFamily(
            "tokenfair:prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        hits.add_metric([], snap.prefix_hit_tokens)
        yield hits
        queries = CounterMetricFamily(
            "tokenfair:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        queries.add_metric([], snap.prefix_query_tokens)
        yield queries
        steps = CounterMetricFamily("tokenfair:engine_steps", "Engine steps run.")
        steps.add_metric([], snap.num_steps)
        yield steps


def _group_series(metrics: ServerMetrics, snap: Snapshot) -> Iterable[Metric]:
    """Per group of tenants (by its path): counter, weight, and its tenants' service."""
    tree = metrics.tree
    if tree.flat:
        return
    groups = sorted(node[1:] for node in tree.groups())
    service: dict[str, float] = dict.fromkeys(groups, 0.0)
    for tenant, amount in metrics.service.items():
        for node in tree.path(tenant)[:-1]:
            service[node[1:]] += amount
    series = (
        (families.GROUP_VTC_COUNTER, snap.group_counters),
        (families.GROUP_WEIGHT, {g: snap.weights.get(group_id(g), 1.0) for g in groups}),
        (families.GROUP_SERVICE, service),
    )
    for definition, values in series:
        family = definition.gauge()
        for group in groups:
            family.add_metric([group], float(values.get(group, 0.0)))
        yield family
