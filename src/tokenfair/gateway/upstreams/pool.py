"""The upstream pool: who serves which model, how loaded each one is, who is healthy.

An upstream's capacity is a number of concurrent requests and/or of in-flight tokens
(prompt + max_tokens of the requests it holds): the upstream's own, shared by the
gateway replicas through leases in Redis (replicas/leases.py) when they share one.
Optionally its load follows its own /metrics (vLLM's `vllm:num_requests_running` +
`vllm:num_requests_waiting`, or tokenfair's), so traffic that bypasses the gateway is
counted too. A request goes to the least-loaded healthy upstream that serves its model
and has room for it. Health checks take an upstream out of rotation after `fail_after`
failures in a row and put it back after one success; a request that cannot reach an
upstream counts as a failure. The checks and the /metrics scrapes are GETs of the
gateway's one HTTP client (upstreams/client.py), on keep-alive connections of
their own, each bounded by `health.timeout_s` in all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from prometheus_client.parser import text_string_to_metric_families

from tokenfair.edge.tasks import cancel_and_wait
from tokenfair.gateway.config import HealthConfig, RoutingConfig, UpstreamConfig
from tokenfair.gateway.upstreams.capacity import Lease
from tokenfair.gateway.upstreams.client import PROBE_HEADERS, UpstreamClient, failure_name
from tokenfair.gateway.upstreams.kinds import KINDS
from tokenfair.gateway.upstreams.prefix import PrefixKey
from tokenfair.gateway.upstreams.routing import Router, make_router

log = logging.getLogger("tokenfair.gateway")

# Below uvicorn's 5 s keep-alive (vLLM's and SGLang's servers too): the gateway drops an
# idle connection before the upstream does, so a request never lands on a closing one.
KEEPALIVE_S = 4.0


def parse_load(text: str, flavour: str) -> tuple[float, float]:
    """Running and waiting requests summed over every series of the upstream's metrics
    (prometheus_client's parser reads the text format)."""
    prefix = KINDS[flavour].metrics_prefix
    assert prefix is not None, f"{flavour!r} has no metrics to follow"
    wanted = {prefix + "num_requests_running": 0, prefix + "num_requests_waiting": 1}
    totals = [0.0, 0.0]
    try:
        for family in text_string_to_metric_families(text):
            index = wanted.get(family.name)
            if index is not None:
                # A counter named like it parses into the same family: its samples
                # keep their own name (`_total`).
                totals[index] += sum(s.value for s in family.samples if s.name == family.name)
    except ValueError:  # not the text format: count nothing, as for an unreadable answer
        return 0.0, 0.0
    return totals[0], totals[1]


class Upstream:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.name: str = config.name or config.url
        self.url = config.url
        self._client: UpstreamClient | None = None
        self.healthy = True
        self.failures = 0  # consecutive
        self.running = 0
        self.inflight_tokens = 0
        # From /metrics (when configured): the upstream's own count, and what this
        # gateway sent since that scrape.
        self.reported: float | None = None
        self.sent_since_scrape = 0
        # With replicas sharing capacity: this replica's part of it (else None: all).
        self.lease: Lease | None = None

    @property
    def client(self) -> UpstreamClient:
        """The keep-alive connection pool to this upstream (opened by the pool's start)."""
        assert self._client is not None, "UpstreamPool.start() opens the clients"
        return self._client

    def open(self) -> None:
        # A lean client of our own, not aiohttp or httpx, on the hot path: theirs was
        # most of the gateway's CPU per proxied request (measured in docs/gateway.md).
        # It sends no cookies, so no tenant's request carries another's.
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if self.config.api_key:
            headers["authorization"] = f"Bearer {self.config.api_key}"
        self._client = UpstreamClient(
            self.url, headers, connect_timeout_s=5.0, keepalive_s=KEEPALIVE_S
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def load(self) -> float:
        running = float(self.running)
        if self.reported is not None:
            running = max(running, self.reported + self.sent_since_scrape)
        return running

    def has_room(self, tokens: int, seats: int = 1) -> bool:
        """Room for a request of `tokens` in-flight tokens running `seats` sequences
        (one per choice: an `n=8` request takes 8 of `max_concurrent`). A request wider
        than the whole of either limit still goes to an idle upstream."""
        if not self.healthy:
            return False
        cap = self.config
        if cap.max_concurrent is not None:
            load = self.load()
            if load + seats > cap.max_concurrent and (seats <= cap.max_concurrent or load):
                return False
        lease = self.lease
        if lease is not None:
            return self._within(lease, tokens, seats)
        # A request larger than the whole token budget still goes to an idle upstream.
        return not (
            cap.max_inflight_tokens is not None
            and self.inflight_tokens
            and self.inflight_tokens + tokens > cap.max_inflight_tokens
        )

    def _within(self, lease: Lease, tokens: int, seats: int) -> bool:
        """Room in this replica's lease; a request larger than the whole of a limit
        goes when the lease holds all of it and nothing of this replica runs there."""
        cap = self.config
        limit = cap.max_concurrent
        if (
            limit is not None
            and self.running + seats > lease.slots
            and (seats <= limit or lease.slots < limit or self.running)
        ):
            return False
        budget = cap.max_inflight_tokens
        if budget is None or self.inflight_tokens + tokens <= lease.tokens:
            return True
        return tokens > budget and lease.tokens >= budget and not self.inflight_tokens

    def fullness(self) -> float:
        cap, parts = self.config, []
        if cap.max_concurrent is not None:
            parts.append(self.load() / cap.max_concurrent)
        if cap.max_inflight_tokens is not None:
            parts.append(self.inflight_tokens / cap.max_inflight_tokens)
        return max(parts)

    def acquire(self, tokens: int, seats: int = 1) -> None:
        self.running += seats
        self.inflight_tokens += tokens
        self.sent_since_scrape += seats

    def release(self, tokens: int, seats: int = 1) -> None:
        self.running -= seats
        self.inflight_tokens -= tokens
        if self.lease is not None:  # what frees goes back, down to its due
            self.lease.give_back(self.running, self.inflight_tokens)


class UpstreamPool:
    def __init__(
        self,
        configs: Iterable[UpstreamConfig],
        health: HealthConfig,
        on_change: Callable[[], None] = lambda: None,
        routing: RoutingConfig | None = None,
    ) -> None:
        self.health = health
        self.router: Router = make_router(routing or RoutingConfig(mode="least-loaded"))
        self.on_change = on_change  # capacity may have appeared: wake the dispatcher
        self.upstreams: list[Upstream] = []
        self.upstreams = [Upstream(config) for config in configs]
        self.by_model: dict[str, list[Upstream]] = {}
        for upstream in self.upstreams:
            for model in upstream.config.models:
                self.by_model.setdefault(model, []).append(upstream)
        self._tasks: list[asyncio.Task[None]] = []
        self._probes: dict[Upstream, UpstreamClient] = {}  # health checks and scrapes

    async def _get(self, upstream: Upstream, path: str) -> tuple[int, str]:
        """GET `path` of `upstream` within the health timeout: status and text."""
        status, body = await self._probes[upstream].get(path, self.health.timeout_s)
        return status, body.decode("utf-8", "replace")

    def serves(self, model: str) -> bool:
        return model in self.by_model

    def has_room(
        self, model: str, tokens: int, seats: int = 1, exclude: frozenset[str] = frozenset()
    ) -> bool:
        """Whether some healthy upstream for `model` has room for `tokens` and `seats`
        (no routing)."""
        return any(
            u.name not in exclude and u.has_room(tokens, seats)
            for u in self.by_model.get(model, ())
        )

    def choose(
        self,
        model: str,
        tokens: int,
        seats: int = 1,
        exclude: frozenset[str] = frozenset(),
        prefix: PrefixKey | None = None,
    ) -> Upstream | None:
        """The upstream the router picks among the healthy ones for `model` with room for
        `tokens` and `seats` (None when none has room); the request is then sent there, which the
        router records."""
        serving = [u for u in self.by_model.get(model, ()) if u.healthy and u.name not in exclude]
        candidates = [u for u in serving if u.has_room(tokens, seats)]
        if not candidates:
            return None
        return self.router.route(serving, candidates, prefix)

    def any_eligible(self, model: str, exclude: frozenset[str] = frozenset()) -> bool:
        return any(u.healthy and u.name not in exclude for u in self.by_model.get(model, ()))

    # --- health ---
    def mark_failure(self, upstream: Upstream, why: str) -> None:
        upstream.failures += 1
        if upstream.healthy and upstream.failures >= self.health.fail_after:
            upstream.healthy = False
            self.router.forget(upstream)  # it may come back restarted, its cache empty
            log.warning("upstream %s is out of rotation: %s", upstream.name, why)
            self.on_change()

    def mark_success(self, upstream: Upstream) -> None:
        upstream.failures = 0
        if not upstream.healthy:
            upstream.healthy = True
            log.info("upstream %s is back in rotation", upstream.name)
            self.on_change()

    async def _check(self, upstream: Upstream) -> None:
        try:
            status, _ = await self._get(upstream, upstream.config.health_path)
        except OSError as error:  # UpstreamError, TimeoutError
            self.mark_failure(upstream, f"health check failed ({failure_name(error)})")
            return
        if status == 200:
            self.mark_success(upstream)
        else:
            self.mark_failure(upstream, f"health check returned {status}")

    async def _scrape(self, upstream: Upstream) -> None:
        flavour = upstream.config.capacity_from_metrics
        try:
            status, text = await self._get(upstream, "/metrics")
        except OSError:  # UpstreamError, TimeoutError
            status, text = 0, ""
        if status != 200:
            upstream.reported = None  # fall back to the gateway's own count
            return
        running, waiting = parse_load(text, flavour)
        upstream.reported = running + waiting
        upstream.sent_since_scrape = 0
        self.on_change()

    async def _every(self, interval: float, step: Callable[[Upstream], Awaitable[None]]) -> None:
        while True:
            await asyncio.gather(*(step(u) for u in self.upstreams), return_exceptions=True)
            await asyncio.sleep(interval)

    def start(self) -> None:
        """Open the connection pools and start the health checks (in the running loop)."""
        for upstream in self.upstreams:
            upstream.open()
        self._probes = {
            u: UpstreamClient(
                u.url,
                PROBE_HEADERS,
                connect_timeout_s=self.health.timeout_s,
                keepalive_s=KEEPALIVE_S,
                max_idle=2,
            )
            for u in self.upstreams
        }
        self._tasks.append(asyncio.create_task(self._every(self.health.interval_s, self._check)))
        if any(u.config.capacity_from_metrics != "none" for u in self.upstreams):

            async def scrape(upstream: Upstream) -> None:
                if upstream.config.capacity_from_metrics != "none":
                    await self._scrape(upstream)

            self._tasks.append(
                asyncio.create_task(self._every(self.health.metrics_interval_s, scrape))
            )

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        for upstream in self.upstreams:
            await upstream.close()
        for client in self._probes.values():
            await client.close()
