"""The gateway process: its parts, their lifecycle, and the ASGI application.

The completion endpoints go straight to the proxy's raw ASGI handler; everything else
(/v1/models, /health, /metrics, unknown paths) is a small FastAPI app with the server's
error handlers, so every error has OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query
from fastapi.responses import JSONResponse, Response

from tokenfair.core.cost import LinearCost
from tokenfair.core.share_tree import is_group
from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.endpoints import COMPLETION_PATHS
from tokenfair.edge.errors import APIError, install_error_handlers
from tokenfair.edge.limits import Limits
from tokenfair.edge.tenants import TenantsFileError, load_tenants, parse_tenants
from tokenfair.edge.weight_change import WeightChange
from tokenfair.gateway.admission import RECENT_DISPATCHES, Admission
from tokenfair.gateway.capacity import ModelDemand
from tokenfair.gateway.config import GatewayConfig, GatewayConfigError
from tokenfair.gateway.counters import CounterStore, MemoryCounterStore
from tokenfair.gateway.flow.fairness import CounterFairness, Fairness, PolicyFairness
from tokenfair.gateway.flow.order import ORDERS
from tokenfair.gateway.metrics import GatewayMetrics
from tokenfair.gateway.pool import UpstreamPool
from tokenfair.gateway.proxy import CompletionProxy
from tokenfair.gateway.tokens import TokenCounter, load_tokenizer

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
            directory = TenantDirectory(parse_tenants(config.tenants, "tenants"))
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
    from tokenfair.gateway.redis_store import RedisCounterStore

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
    )


class Gateway:
    """Everything one gateway process holds."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        # This replica in Redis (its counters' waiting hash, its capacity leases).
        self.replica_id = config.gateway_id or uuid.uuid4().hex[:12]
        self.directory = build_directory(config)
        self.cost = LinearCost(config.cost.w_in, config.cost.w_out)
        self.pool = UpstreamPool(config.upstreams, config.health, routing=config.routing)
        self.limits = Limits(config.max_waiting, who="the gateway")
        self.stores: dict[int, CounterStore] = {}  # band -> its counters
        self._fairness: dict[int, Fairness] = {}
        self._started = False
        self._background: set[asyncio.Task[None]] = set()
        self.fairness(0)
        self.admission = Admission(self.pool, self.fairness)
        self.metrics = GatewayMetrics(self.admission, self.pool, self.stores)
        self._counters = token_counters(config)
        self._estimate = TokenCounter()
        self.leases = self._leases()

    def _leases(self) -> Any:
        """The replicas' shared capacity (None: this replica has it all)."""
        r = self.config.redis
        if r is None or not r.share_capacity:
            return None
        from tokenfair.gateway.leases import LeaseLedger

        ledger = LeaseLedger(
            r.url,
            self.pool.upstreams,
            self.waiting_demand,
            self.admission.wake,
            namespace=r.namespace,
            gateway_id=self.replica_id,
            timeout_s=r.timeout_s,
            sync_interval_s=r.flush_interval_s,
            idle_interval_s=r.heartbeat_s,
            ttl_s=r.gateway_ttl_s,
        )
        self.admission.on_wait = ledger.nudge
        return ledger

    def waiting_demand(self) -> dict[str, ModelDemand]:
        """What the requests waiting here need, per model, and the best claim among
        them: (band, the counter of its tenant's top-level node)."""
        demand: dict[str, ModelDemand] = {}
        counters: dict[int, dict[str, float]] = {}
        tree = self.directory.tree
        for band, tenant, model, queue in self.admission.waiting_queues():
            need = demand.get(model)
            if need is None:
                need = demand[model] = ModelDemand()
            need.requests += len(queue)
            need.tokens += queue.tokens()
            if band not in counters:
                store = self.stores.get(band)
                counters[band] = store.counters() if store is not None else {}
            top = tenant if tree.flat else tree.path(tenant)[0]
            claim = (band, counters[band].get(top, 0.0))
            if need.claim is None or claim < need.claim:
                need.claim = claim
        for ticket in self.admission.retrying:  # they go first: the best claim of all
            need = demand.get(ticket.model)
            if need is None:
                need = demand[ticket.model] = ModelDemand()
            need.requests += 1
            need.tokens += ticket.tokens
            need.claim = (-1, 0.0)
        return demand

    @property
    def store(self) -> CounterStore | None:
        """The counters of band 0 (every tenant's, without bands)."""
        return self.stores.get(0)

    def store_for(self, band: int) -> CounterStore | None:
        self.fairness(band)
        return self.stores.get(band)

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
        log.warning("tenants file reloaded")

    def token_counter(self, model: str) -> TokenCounter:
        return self._counters.get(model, self._estimate)

    async def start(self) -> None:
        with contextlib.suppress(
            NotImplementedError, RuntimeError
        ):  # no signals off the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_tenants)
        for band in sorted({t.band for t in self.directory.tenants}):
            self.fairness(band)
        for store in list(self.stores.values()):
            await store.start()
        self._started = True
        self.pool.start()
        if self.leases is not None:
            await self.leases.start()
        self.admission.start()

    async def close(self) -> None:
        await self.admission.close()
        if self.leases is not None:
            await self.leases.close()
        await self.pool.close()
        for store in list(self.stores.values()):
            await store.close()


def _side_app(gateway: Gateway) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.close()

    app = FastAPI(title="tokenfair gateway", lifespan=lifespan)
    install_error_handlers(app)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {"id": m, "object": "model", "owned_by": "tokenfair-gateway"}
            for m in gateway.config.served_models()
        ]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy = [u.name for u in gateway.pool.upstreams if u.healthy]
        if not healthy:
            raise APIError(503, "no upstream is in rotation", code="no_upstream")
        return JSONResponse({"status": "ok", "upstreams": healthy})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    def check_admin(authorization: str | None) -> None:
        if gateway.directory.admin_enabled:
            gateway.directory.check_admin(authorization)

    @app.get("/v1/gateway/requests/recent")
    async def recent(
        tenant: Annotated[str | None, Query(max_length=256)] = None,
        limit: Annotated[int, Query(ge=1, le=RECENT_DISPATCHES)] = 100,
        authorization: str | None = Header(default=None),
    ) -> dict[str, Any]:
        """The last dispatched requests, oldest first: seconds waited in the gateway and
        how many requests were dispatched ahead of each while it waited."""
        check_admin(authorization)
        rows = [r for r in gateway.admission.recent if tenant is None or r["tenant"] == tenant]
        return {"object": "list", "data": rows[-limit:]}

    # The admin API's weight changes, as the server's: until the next reload; a request
    # already dispatched keeps the weights it started with. `:path`: names and group
    # paths may hold slashes.
    @app.post("/admin/tenants/{name:path}/weight")
    async def set_tenant_weight(
        name: str, change: WeightChange, authorization: str | None = Header(default=None)
    ) -> dict[str, Any]:
        gateway.directory.check_admin(authorization)
        try:
            gateway.directory.set_weight(name, change.weight)
        except KeyError:
            raise APIError(404, f"no tenant named {name!r}", param="name") from None
        return {"name": name, "weight": change.weight}

    @app.post("/admin/groups/{path:path}/weight")
    async def set_group_weight(
        path: str, change: WeightChange, authorization: str | None = Header(default=None)
    ) -> dict[str, Any]:
        gateway.directory.check_admin(authorization)
        try:
            gateway.directory.set_group_weight(path, change.weight)
        except KeyError:
            raise APIError(404, f"no group {path!r}", param="path") from None
        return {"path": path, "weight": change.weight}

    @app.get("/v1/gateway/state")
    async def state(authorization: str | None = Header(default=None)) -> dict[str, Any]:
        """Counters, queues and upstreams (behind the admin key when one is set)."""
        check_admin(authorization)
        stores = list(gateway.stores.values())
        counters: dict[str, float] = {}
        for store in stores:
            counters.update(store.counters())
        return {
            "policy": gateway.config.policy,
            "counters": {n: c for n, c in counters.items() if not is_group(n)},
            "group_counters": {n[1:]: c for n, c in counters.items() if is_group(n)},
            "degraded": any(store.degraded for store in stores),
            "waiting": dict(gateway.admission.waiting),
            "running": dict(gateway.admission.running),
            "upstreams": {
                u.name: {
                    "healthy": u.healthy,
                    "running": u.running,
                    "inflight_tokens": u.inflight_tokens,
                    **({} if u.lease is None else {"lease": u.lease.view()}),
                }
                for u in gateway.pool.upstreams
            },
        }

    return app


def create_app(config: GatewayConfig) -> Any:
    """The ASGI application of one gateway."""
    gateway = Gateway(config)
    side = _side_app(gateway)
    proxy = CompletionProxy(gateway)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] in COMPLETION_PATHS
            and scope["method"] == "POST"
        ):
            await proxy(scope, receive, send)
        else:
            await side(scope, receive, send)

    app.gateway = gateway  # type: ignore[attr-defined]
    return app
