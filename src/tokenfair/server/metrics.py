"""Prometheus metrics, vLLM's names under a `tokenfair:` prefix, with a `tenant` label.

Two sources. Events (tokens, latencies, finishes) are recorded on the event loop from
each engine step's outputs, aggregated per step so the cost does not grow with every
token. State (running, waiting, KV usage, preemptions, VTC counters) is read from the
engine at scrape time, on its thread between two steps (`EngineStats`, the engine's own
account of itself), so it is exact and costs nothing between scrapes. The per-tenant families are the
gateway's too (`edge/tenant_metrics.py`); KV, preemptions and steps are the engine's.

Latencies are in engine time: arrival, first token and finish are stamped by the
engine's clock when the step that produced them ends.

Request-level families count HTTP requests, as the gateway's do: a request of several
choices (`n` > 1, a list of prompts) is one success or error, its prompts count once
(as its usage reports them), its TTFT is its first token, its latency its last choice's
end. `choice_*` count per choice (an engine request); `tenant_service` is what the
tenant's counter was charged, the prompt once per choice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokenfair.core.cost import LinearCost
from tokenfair.core.request import FinishReason, Request
from tokenfair.core.share_tree import ShareTree, group_id
from tokenfair.edge.loop_counter import LoopCounter, LoopCounterSeries
from tokenfair.edge.tenant_metrics import (
    TenantMetrics,
    TenantSeries,
    build_info,
    group_series,
    tenant_gauges,
)
from tokenfair.engine.engine import RequestOutput
from tokenfair.engine.stats import EngineStats

RECENT_REQUESTS = 2048  # finished requests kept for GET /admin/requests/recent


@dataclass(slots=True)
class _Answer:
    """The choices of one request (`n` > 1, or a list of prompts), counted as one
    request by the request-level families."""

    left: int  # choices not ended yet
    first: str  # choice 0's request id: the request ended as it did
    reason: str = "abort"
    prompts: set[int] = field(default_factory=set)  # the prompts counted so far
    started: bool = False  # some choice has its first token
    timed_out: bool = False


class ServerMetrics:
    def __init__(self, cost: LinearCost | None = None) -> None:
        disable_created_metrics()  # no *_created series, as vLLM does
        self.registry = CollectorRegistry(auto_describe=True)
        self.cost = cost or LinearCost()
        self.per_tenant = TenantMetrics()
        self.registry.register(self.per_tenant)
        self.backpressure = LoopCounter(
            "tokenfair:stream_backpressure",
            "Streams cut because their client read too slowly: what waited for it passed "
            "--max-stream-buffer-bytes.",
            ("tenant",),
        )
        self.registry.register(self.backpressure)
        # Per choice (an engine request): what the engine ran. The request-level
        # families count a request of several choices once.
        self.choice_success = LoopCounter(
            "tokenfair:choice_success",
            "Choices (engine requests: n per prompt of a request) answered and ended, by "
            "how; request_success counts the requests.",
            ("tenant", "finished_reason"),
        )
        self.choice_prompt_tokens = LoopCounter(
            "tokenfair:choice_prompt_tokens",
            "Prompt tokens per choice: a request of n choices counts its prompt n times "
            "(the engine's work); prompt_tokens counts it once, as usage does.",
            ("tenant",),
        )
        self.registry.register(self.choice_success)
        self.registry.register(self.choice_prompt_tokens)
        self._choice_prompts: dict[str, LoopCounterSeries] = {}
        # A choice of several -> its request and its prompt's index; the choices of a
        # request refused whole, whose ends count at the choice level only.
        self._answers: dict[str, tuple[_Answer, int]] = {}
        self._quiet: set[str] = set()
        self.tree = ShareTree()  # the tenants' groups, for the per-group series
        self.snapshot = EngineStats()
        self._last_token_s: dict[str, float] = {}  # request id -> engine time of its last token
        self._arrival_step: dict[str, int] = {}
        self._first_step: dict[str, tuple[int, float]] = {}  # step and hand-over time
        self._timed_out: set[str] = set()  # aborted for their timeout: errors, not ends
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)
        self.registry.register(_EngineStatsCollector(self))

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

    def choices(self, request_ids: list[str], per_prompt: int) -> None:
        """These engine requests are the choices of one request (`per_prompt` choices of
        each prompt, prompt by prompt): count it once. Called before any is submitted."""
        answer = _Answer(left=len(request_ids), first=request_ids[0])
        for index, request_id in enumerate(request_ids):
            self._answers[request_id] = (answer, index // per_prompt)

    def choices_refused(self, request_ids: list[str], submitted: list[str]) -> None:
        """The request was refused whole (its refusal already counted): the choices
        `submitted` to the engine end at the choice level only."""
        for request_id in request_ids:
            self._answers.pop(request_id, None)
        self._quiet.update(submitted)

    def arrived(self, request_id: str, step: int) -> None:
        """Note the engine's step count when a request was submitted."""
        self._arrival_step[request_id] = step

    def on_step(self, outputs: list[RequestOutput], now: float, step: int = 0) -> None:
        """Record one engine step's outputs (called on the loop before streams see them)."""
        last = self._last_token_s
        answers = self._answers
        generated: dict[str, TenantSeries] = {}
        counts: dict[str, int] = {}
        w_in = self.cost.w_in
        per_tenant = self.per_tenant
        for output in outputs:
            request = output.request
            tenant = request.client
            rid = request.request_id
            series = per_tenant.of(tenant)
            entry = answers.get(rid) if answers else None
            n = len(output.new_token_ids)
            if n:
                generated[tenant] = series
                counts[tenant] = counts.get(tenant, 0) + n
                previous = last.get(rid)
                if previous is None:
                    self._first_step[rid] = (step, now)
                    self._choice_prompt(tenant).inc(request.input_tokens)
                    series.service.inc(w_in * request.input_tokens)
                    if entry is None:
                        series.prompt_tokens.inc(request.input_tokens)
                        self._first_token(series, request, now)
                    else:
                        answer, prompt = entry
                        if prompt not in answer.prompts:  # each prompt once, as usage
                            answer.prompts.add(prompt)
                            series.prompt_tokens.inc(request.input_tokens)
                        if not answer.started:
                            answer.started = True
                            self._first_token(series, request, now)
                else:
                    series.itl.observe(now - previous)
                last[rid] = now
            if output.finished:
                last.pop(rid, None)
                self._log_finished(request, now, step)
                reason = request.finish_reason
                label = reason.value if reason is not None else "abort"
                timed_out = rid in self._timed_out
                if timed_out:
                    self._timed_out.discard(rid)
                rejected = reason is FinishReason.REJECTED
                if not (timed_out or rejected):
                    self.choice_success.labels(tenant, label).inc()
                finish = request.finish_s if request.finish_s is not None else now
                if entry is not None:
                    self._choice_ended(series, entry[0], rid, label, timed_out, finish, request)
                    del answers[rid]
                elif self._quiet and rid in self._quiet:
                    self._quiet.discard(rid)
                elif not rejected:
                    if timed_out:
                        series.failed("timeout")
                    else:
                        series.succeeded(label)
                    series.e2e.observe(finish - request.arrival_s)
        w_out = self.cost.w_out
        for tenant, series in generated.items():
            n = counts[tenant]
            series.generation_tokens.inc(n)
            series.service.inc(w_out * n)

    def _choice_prompt(self, tenant: str) -> LoopCounterSeries:
        series = self._choice_prompts.get(tenant)
        if series is None:
            series = self._choice_prompts[tenant] = self.choice_prompt_tokens.labels(tenant)
        return series

    @staticmethod
    def _first_token(series: TenantSeries, request: Request, now: float) -> None:
        first = request.first_token_s if request.first_token_s is not None else now
        series.ttft.observe(first - request.arrival_s)
        if request.scheduled_s is not None:
            series.queue.observe(request.scheduled_s - request.arrival_s)

    @staticmethod
    def _choice_ended(
        series: TenantSeries,
        answer: _Answer,
        rid: str,
        label: str,
        timed_out: bool,
        finish: float,
        request: Request,
    ) -> None:
        """One choice of several ended; the request ends with its last choice, as its
        choice 0 ended (or in an error, when one choice timed out)."""
        answer.left -= 1
        answer.timed_out = answer.timed_out or timed_out
        if rid == answer.first:
            answer.reason = label
        if answer.left:
            return
        if answer.timed_out:
            series.failed("timeout")
        else:
            series.succeeded(answer.reason)
        series.e2e.observe(finish - request.arrival_s)

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

    def render(self, snapshot: EngineStats) -> bytes:
        self.snapshot = snapshot
        per_tenant = self.per_tenant
        retired = set(per_tenant.retired)
        per_tenant.sweep({*snapshot.running, *snapshot.waiting, *snapshot.swapped})
        for tenant in retired - per_tenant.retired:  # swept: its server-only series too
            self._choice_prompts.pop(tenant, None)
            for counter in (self.choice_success, self.choice_prompt_tokens, self.backpressure):
                counter.remove_first(tenant)
        return generate_latest(self.registry)


class _EngineStatsCollector:
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
        failures = CounterMetricFamily(
            "tokenfair:policy_failures",
            "Exceptions raised by the scheduling policy's hooks; after the first, the "
            "server schedules first come, first served (/health names the hook).",
        )
        failures.add_metric([], snap.policy_failures)
        yield failures
        steps = CounterMetricFamily("tokenfair:engine_steps", "Engine steps run.")
        steps.add_metric([], snap.num_steps)
        yield steps


def _group_series(metrics: ServerMetrics, snap: EngineStats) -> Iterable[Metric]:
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
