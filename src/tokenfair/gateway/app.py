"""The gateway process: its parts, their lifecycle, and the ASGI application.

The completion endpoints go straight to the proxy's raw ASGI handler; everything else
(/v1/models, /health, /metrics, the state pages, unknown paths) is a small FastAPI app
(side_app.py) with the server's error handlers, so every error has OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from typing import Any

from tokenfair.core.cost import LinearCost
from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.endpoints import COMPLETION_PATHS
from tokenfair.edge.limits import Limits
from tokenfair.edge.operator_port import on_port, only_operator_pages
from tokenfair.edge.tenants import TenantsFileError, load_tenants, parse_tenants
from tokenfair.gateway.config import GatewayConfig, GatewayConfigError
from tokenfair.gateway.flow.admission import Admission
from tokenfair.gateway.flow.fairness import CounterFairness, Fairness, PolicyFairness
from tokenfair.gateway.flow.order import ORDERS
from tokenfair.gateway.flow.tokens import TokenCounter, load_tokenizer
from tokenfair.gateway.metrics import GatewayMetrics
from tokenfair.gateway.reach import probe
from tokenfair.gateway.replicas.counters import CounterStore, MemoryCounterStore
from tokenfair.gateway.side_app import OPERATOR_PAGES, side_app
from tokenfair.gateway.transport.proxy import CompletionProxy
from tokenfair.gateway.transport.upstream_tenant import CacheSalts, isolation_warning, salt_key
from tokenfair.gateway.upstreams.capacity import ModelDemand
from tokenfair.gateway.upstreams.pool import UpstreamPool

log = logging.getLogger("tokenfair.gateway")


def token_counters(config: GatewayConfig) -> dict[str, TokenCounter]:
    """Each model's exact prompt counter, from the tokenizer its config names (loaded
    here, so that `--check` finds one that cannot load as the start would)."""
    counters: dict[str, TokenCounter] = {}
    for model, settings in config.models.items():
        if settings.tokenizer is not None:
            path = config.base_dir / settings.tokenizer
            name = str(path) if path.exists() else settings.tokenizer
            try:
                counters[model] = TokenCounter(load_tokenizer(name))
            except Exception as error:  # transformers raises many kinds
                raise GatewayConfigError(
                    f"models.{model}.tokenizer: cannot load {settings.tokenizer!r}: {error}"
                ) from None
    return counters


def build_directory(config: GatewayConfig) -> TenantDirectory:
    """The tenants the config names (a file in the server's format, or inline)."""
    if config.tenants is None:
        return TenantDirectory.open(tenant_from_user=config.tenant_from_user)
    try:
        if isinstance(config.tenants, str):
            directory = TenantDirectory(load_tenants(config.base_dir / config.tenants))
        else:
            inline = parse_tenants(
                config.tenants, config.source, config.tenants_node, key_prefix=("tenants",)
            )
            directory = TenantDirectory(inline)
    except TenantsFileError as error:
        raise GatewayConfigError(str(error)) from None
    if not directory.tree.flat and not config.shared_counters:
        raise GatewayConfigError(
            f"policy: {config.policy!r} does not share by groups, and the tenants file has "
            "groups; use vtc, wvtc, vtc-artifact or lcf"
        )
    return directory


def build_store(
    config: GatewayConfig, band: int = 0, gateway_id: str | None = None
) -> CounterStore | None:
    """The counters of one band (each band is a VTC of its own), or None for the core's
    ordering policies."""
    if not config.shared_counters:
        return None
    if config.redis is None:
        return MemoryCounterStore(config.lift_rule)
    from tokenfair.gateway.replicas.redis_store import RedisCounterStore

    r = config.redis
    return RedisCounterStore(
        r.url,
        namespace=r.namespace if band == 0 else f"{r.namespace}:band{band}",
        gateway_id=gateway_id or config.gateway_id,
        lift=config.lift_rule,
        timeout_s=r.timeout_s,
        flush_interval_s=r.flush_interval_s,
        heartbeat_s=r.heartbeat_s,
        gateway_ttl_s=r.gateway_ttl_s,
        sync_every=r.sync_every,
    )


class Gateway:
    """Everything one gateway process holds."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        # This replica in Redis (its counters' waiting hash, its capacity leases).
        self.replica_id = config.gateway_id or uuid.uuid4().hex[:12]
        self.directory = build_directory(config)
        self.cost = LinearCost(config.cost.w_in, config.cost.w_out)
        namespace = config.redis.namespace if config.redis is not None else None
        # The per-tenant prefix-cache salts sent upstream (transport/upstream_tenant.py).
        self.salts = CacheSalts(salt_key(config.cache_salt_secret, namespace))
        self.pool = UpstreamPool(config.upstreams, config.health, routing=config.routing)
        self.limits = Limits(config.max_waiting, who="the gateway")
        self.stores: dict[int, CounterStore] = {}  # band -> its counters
        self._fairness: dict[int, Fairness] = {}
        self._started = False
        self._background: set[asyncio.Task[None]] = set()
        self.fairness(0)
        self.admission = Admission(self.pool, self.fairness)
        self.metrics = GatewayMetrics(self.admission, self.pool, self.stores, self.directory)
        self._counters = token_counters(config)
        self._estimate = TokenCounter()
        self.leases = self._leases()

    def _leases(self) -> Any:
        """The replicas' shared capacity (None: this replica has it all)."""
        r = self.config.redis
        if r is None or not r.share_capacity:
            return None
        from tokenfair.gateway.replicas.leases import CapacityLeases

        leases = CapacityLeases(
            r.url,
            self.pool.upstreams,
            self.waiting_demand,
            self.admission.wake,
            namespace=r.namespace,
            gateway_id=self.replica_id,
            timeout_s=r.timeout_s,
            idle_interval_s=r.heartbeat_s,
            ttl_s=r.gateway_ttl_s,
        )
        self.admission.on_wait = leases.nudge
        return leases

    def waiting_demand(self) -> dict[str, ModelDemand]:
        """What the requests waiting here need, per model: the best claim among them
        (band, the counter of its tenant's top-level node), and the top-level nodes
        waiting with their weights (the capacity is shared by them)."""
        demand: dict[str, ModelDemand] = {}
        counters: dict[int, dict[str, float]] = {}
        tree = self.directory.tree
        weights = self.directory.weights()
        for band, tenant, model, queue in self.admission.waiting_queues():
            need = demand.get(model)
            if need is None:
                need = demand[model] = ModelDemand()
            need.seats += queue.seats()
            need.tokens += queue.tokens()
            if band not in counters:
                store = self.stores.get(band)
                counters[band] = store.counters() if store is not None else {}
            top = tenant if tree.flat else tree.path(tenant)[0]
            if top not in need.nodes:
                need.nodes[top] = weights.get(top, 1.0)
            claim = (band, counters[band].get(top, 0.0))
            if need.claim is None or claim < need.claim:
                need.claim = claim
        for ticket in self.admission.retrying:  # they go first: the best claim of all
            need = demand.get(ticket.model)
            if need is None:
                need = demand[ticket.model] = ModelDemand()
            need.seats += ticket.seats
            need.tokens += ticket.tokens
            need.claim = (-1, 0.0)
        return demand

    @property
    def store(self) -> CounterStore | None:
        """The counters of band 0 (every tenant's, without bands)."""
        return self.stores.get(0)

    def fairness(self, band: int) -> Fairness:
        """The fairness seam of a band, made when the band is first used."""
        fairness = self._fairness.get(band)
        if fairness is None:
            store = build_store(self.config, band, self.replica_id)
            if store is None:
                fairness = PolicyFairness(self.config.policy)
            else:
                self.stores[band] = store
                fairness = CounterFairness(store, ORDERS[self.config.order_within_tenant])
                if self._started:  # a band new since the start (a reload)
                    task = asyncio.ensure_future(store.start())
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
            self._fairness[band] = fairness
        return fairness

    def reload_tenants(self) -> None:
        """SIGHUP: re-read the tenants file; a bad one is refused and the old one stays."""
        if not isinstance(self.config.tenants, str):
            return
        try:
            self.directory.replace(load_tenants(self.config.base_dir / self.config.tenants))
        except TenantsFileError as error:
            log.error("tenants file not reloaded, the previous one stays in force: %s", error)
            return
        # Removed tenants' series go once nothing of theirs waits or runs.
        self.metrics.per_tenant.tenants_now(t.name for t in self.directory.tenants)
        log.info("tenants file reloaded: %d tenant(s)", len(self.directory.tenants))

    def token_counter(self, model: str) -> TokenCounter:
        return self._counters.get(model, self._estimate)

    async def start(self) -> None:
        with contextlib.suppress(
            NotImplementedError, RuntimeError
        ):  # no signals off the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_tenants)
        for band in sorted({t.band for t in self.directory.tenants}):
            self.fairness(band)
        await self._log_reach()
        for store in list(self.stores.values()):
            await store.start()
        self._started = True
        self.pool.start()
        if self.leases is not None:
            await self.leases.start()
        self.admission.start()

    async def _log_reach(self) -> None:
        """One line for what this gateway is, and one per upstream and Redis reached."""
        config = self.config
        listen = config.listen
        metrics = (
            f"; metrics on port {listen.metrics_port}"
            if listen.metrics_port is not None
            else "; /metrics behind the admin key"
            if self.directory.admin_enabled
            else ""
        )
        log.info(
            "gateway %s: policy %s, routing %s, %d tenant(s), models %s%s",
            self.replica_id,
            config.policy,
            config.routing.mode,
            len(self.directory.tenants),
            ", ".join(config.served_models()),
            metrics,
        )
        if not metrics and not self.directory.open_mode:
            log.warning(
                "/metrics and the state pages are not served: they show every tenant's "
                "usage, so they need listen.metrics_port, or an admin key "
                "(admin_key_sha256) in the tenants file"
            )
        for reach in await probe(config):
            log.log(logging.INFO if reach.ok else logging.WARNING, "%s", reach.line())
        warning = isolation_warning(config.upstreams, self.directory)
        if warning is not None:
            log.warning("%s", warning)

    async def close(self) -> None:
        await self.admission.close()
        if self.leases is not None:
            await self.leases.close()
        await self.pool.close()
        for store in list(self.stores.values()):
            await store.close()


def create_app(config: GatewayConfig) -> Any:
    """The ASGI application of one gateway: the completions go to the proxy; the rest,
    and the metrics port's pages, to the side app."""
    gateway = Gateway(config)
    side = side_app(gateway)
    proxy = CompletionProxy(gateway)
    metrics_port = config.listen.metrics_port

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if on_port(scope, metrics_port):
                if scope["path"] not in OPERATOR_PAGES:
                    error = only_operator_pages(scope["path"], OPERATOR_PAGES)
                    await error.response()(scope, receive, send)
                    return
            elif scope["path"] in COMPLETION_PATHS and scope["method"] == "POST":
                await proxy(scope, receive, send)
                return
        await side(scope, receive, send)

    app.gateway = gateway  # type: ignore[attr-defined]
    app.proxy = proxy  # type: ignore[attr-defined]
    return app
