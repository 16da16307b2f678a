"""Prometheus metrics, vLLM's names under a `tokenfair:` prefix, with a `tenant` label.

Two sources. Events (tokens, latencies, finishes) are recorded on the event loop from
each engine step's outputs, aggregated per step so the cost does not grow with every
token. State (running, waiting, KV usage, preemptions, VTC counters) is read from the
scheduler at scrape time, on the engine thread between two steps (a `Snapshot`), so
it is exact and costs nothing between scrapes. The per-tenant families are the
gateway's too (`edge/tenant_metrics.py`); KV, preemptions and steps are the engine's.

Latencies are in engine time: arrival, first token and finish are stamped by the
engine's clock when the step that produced them ends.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokenfair.core.cost import LinearCost
from tokenfair.core.request import FinishReason, Request
from tokenfair.core.share_tree import ShareTree, group_id, is_group
from tokenfair.edge.loop_counter import LoopCounter
from tokenfair.edge.tenant_metrics import (
    TenantMetrics,
    TenantSeries,
    build_info,
    group_series,
    tenant_gauges,
)
from tokenfair.engine.engine import Engine, RequestOutput

RECENT_REQUESTS = 2048  # finished requests kept for GET /admin/requests/recent


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
        self.per_tenant = TenantMetrics()
        self.registry.register(self.per_tenant)
        self.backpressure = LoopCounter(
            "tokenfair:stream_backpressure",
            "Times a streamed token found its client's socket full (the client reads slower "
            "than tokens come): the token waited in the server, the engine did not.",
            ("tenant",),
        )
        self.registry.register(self.backpressure)
        self.tree = ShareTree()  # the tenants' groups, for the per-group series
        self.snapshot = Snapshot()
        self._last_token_s: dict[str, float] = {}  # request id -> engine time of its last token
        self._arrival_step: dict[str, int] = {}
        self._first_step: dict[str, tuple[int, float]] = {}  # step and hand-over time
        self._timed_out: set[str] = set()  # aborted for their timeout: errors, not ends
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)
        self.registry.register(_SnapshotCollector(self))

    def tenants(self, names: Iterable[str]) -> None:
        """The tenants of the file in force: reported even before they send anything
        (zeros, not absent series); those no longer in it are retired."""
        self.per_tenant.tenants_now(names)

    @property
    def service(self) -> dict[str, float]:
        """Weighted tokens received, per tenant."""
        return self.per_tenant.service_of()

    def reject(self, tenant: str, reason: str) -> None:
        self.per_tenant.of(tenant).rejected(reason)

    def fail(self, tenant: str, reason: str) -> None:
        self.per_tenant.of(tenant).failed(reason)

    def timed_out(self, request_id: str) -> None:
        """The request is aborted for its timeout: its end is an error (a 408)."""
        self._timed_out.add(request_id)

    def arrived(self, request_id: str, step: int) -> None:
        """Note the engine's step count when a request was submitted."""
        self._arrival_step[request_id] = step

    def on_step(self, outputs: list[RequestOutput], now: float, step: int = 0) -> None:
        """Record one engine step's outputs (called on the loop before streams see them)."""
        last = self._last_token_s
        generated: dict[str, TenantSeries] = {}
        counts: dict[str, int] = {}
        w_in = self.cost.w_in
        per_tenant = self.per_tenant
        for output in outputs:
            request = output.request
            tenant = request.client
            rid = request.request_id
            series = per_tenant.of(tenant)
            n = len(output.new_token_ids)
            if n:
                generated[tenant] = series
                counts[tenant] = counts.get(tenant, 0) + n
                previous = last.get(rid)
                if previous is None:
                    self._first_step[rid] = (step, now)
                    first = request.first_token_s if request.first_token_s is not None else now
                    series.ttft.observe(first - request.arrival_s)
                    if request.scheduled_s is not None:
                        series.queue.observe(request.scheduled_s - request.arrival_s)
                    series.prompt_tokens.inc(request.input_tokens)
                    series.service.inc(w_in * request.input_tokens)
                else:
                    series.itl.observe(now - previous)
                last[rid] = now
            if output.finished:
                last.pop(rid, None)
                self._log_finished(request, now, step)
                reason = request.finish_reason
                if rid in self._timed_out:
                    self._timed_out.discard(rid)
                    series.failed("timeout")
                elif reason is not FinishReason.REJECTED:
                    series.succeeded(reason.value if reason is not None else "abort")
                if reason is not FinishReason.REJECTED:
                    finish = request.finish_s if request.finish_s is not None else now
                    series.e2e.observe(finish - request.arrival_s)
        w_out = self.cost.w_out
        for tenant, series in generated.items():
            n = counts[tenant]
            series.generation_tokens.inc(n)
            series.service.inc(w_out * n)

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
        self.per_tenant.sweep({*snapshot.running, *snapshot.waiting, *snapshot.swapped})
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
            metrics.per_tenant.known | set(snap.running) | set(snap.waiting) | set(snap.swapped)
        )
        yield build_info("server")
        weights = {t: snap.weights.get(t, 1.0) for t in tenants}
        yield from tenant_gauges(tenants, snap.waiting, snap.running, snap.counters, weights)

        def per_tenant(family: GaugeMetricFamily | CounterMetricFamily, values: dict) -> Metric:
            for tenant in tenants:
                family.add_metric([tenant], float(values.get(tenant, 0)))
            return family

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
    weights = {g: snap.weights.get(group_id(g), 1.0) for g in groups}
    yield from group_series(groups, snap.group_counters, weights, service)
