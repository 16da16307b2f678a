"""The gateway process: its parts, their lifecycle, and the ASGI application.

The completion endpoints go straight to the proxy's raw ASGI handler; everything else
(/v1/models, /health, /metrics, unknown paths) is a small FastAPI app with the server's
error handlers, so every error has OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query
from fastapi.responses import JSONResponse, Response

from tokenfair.core.cost import LinearCost
from tokenfair.core.policies.rpm import RPMPolicy
from tokenfair.core.request import Request
from tokenfair.gateway.admission import RECENT_DISPATCHES, Admission
from tokenfair.gateway.config import GatewayConfig, GatewayConfigError
from tokenfair.gateway.counters import CounterStore, MemoryCounterStore
from tokenfair.gateway.metrics import GatewayMetrics
from tokenfair.gateway.pool import UpstreamPool
from tokenfair.gateway.proxy import HOT_PATHS, CompletionProxy
from tokenfair.gateway.tokens import TokenCounter, load_tokenizer
from tokenfair.server.errors import APIError, install_error_handlers
from tokenfair.server.tenants import (
    Tenant,
    TenantDirectory,
    TenantsFileError,
    load_tenants,
    parse_tenants,
)

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
            return TenantDirectory(load_tenants(config.base_dir / config.tenants))
        return TenantDirectory(parse_tenants(config.tenants, "tenants"))
    except TenantsFileError as error:
        raise GatewayConfigError(str(error)) from None


def build_store(config: GatewayConfig) -> CounterStore | None:
    if not config.shared_counters:
        return None
    if config.redis is None:
        return MemoryCounterStore(config.lift_rule)
    from tokenfair.gateway.redis_store import RedisCounterStore

    r = config.redis
    return RedisCounterStore(
        r.url,
        namespace=r.namespace,
        gateway_id=config.gateway_id,
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
        self.directory = build_directory(config)
        self.cost = LinearCost(config.cost.w_in, config.cost.w_out)
        self.pool = UpstreamPool(config.upstreams, config.health, routing=config.routing)
        self.store = build_store(config)
        self.admission = Admission(self.pool, config.policy, self.store, config.max_waiting)
        self.metrics = GatewayMetrics(self.admission, self.pool, lambda: self.store)
        self._counters = token_counters(config)
        self._estimate = TokenCounter()
        self._rate: dict[str, RPMPolicy] = {}

    def rate_limited(self, tenant: Tenant) -> int | None:
        """The tenant's `rpm` limit (the core's sliding 60 s window), if it has one:
        None when the request may go (it is counted), else the whole seconds to wait."""
        if tenant.rpm is None:
            return None
        limiter = self._rate.get(tenant.name)
        if limiter is None or limiter.limit != tenant.rpm:
            limiter = self._rate[tenant.name] = RPMPolicy(limit=tenant.rpm)
        now = time.monotonic()
        if limiter.accept(Request("rate", tenant.name, input_tokens=1, arrival_s=now), now):
            return None
        return max(1, math.ceil(limiter.retry_after(tenant.name, now)))

    def rate_refund(self, tenant: Tenant) -> None:
        """A request that `rate_limited` let through was refused after all."""
        limiter = self._rate.get(tenant.name)
        if limiter is not None:
            limiter.unaccept(tenant.name)

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
        if self.store is not None:
            await self.store.start()
        self.pool.start()
        self.admission.start()

    async def close(self) -> None:
        await self.admission.close()
        await self.pool.close()
        if self.store is not None:
            await self.store.close()


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

    @app.get("/v1/gateway/state")
    async def state(authorization: str | None = Header(default=None)) -> dict[str, Any]:
        """Counters, queues and upstreams (behind the admin key when one is set)."""
        check_admin(authorization)
        store = gateway.store
        return {
            "policy": gateway.config.policy,
            "counters": store.counters() if store is not None else {},
            "degraded": bool(store is not None and store.degraded),
            "waiting": dict(gateway.admission.waiting),
            "running": dict(gateway.admission.running),
            "upstreams": {
                u.name: {
                    "healthy": u.healthy,
                    "running": u.running,
                    "inflight_tokens": u.inflight_tokens,
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
        if scope["type"] == "http" and scope["path"] in HOT_PATHS and scope["method"] == "POST":
            await proxy(scope, receive, send)
        else:
            await side(scope, receive, send)

    app.gateway = gateway  # type: ignore[attr-defined]
    return app
