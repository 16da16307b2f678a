"""The gateway's endpoints other than the completions: a small FastAPI app with the
server's error handlers, and the gateway's lifecycle.

- /v1/models and /v1/models/{id}: the models the upstreams serve, to a tenant's key (as
  the server answers, and OpenAI);
- /health: 200 while some upstream is in rotation, no key; which upstreams, only to
  the operator (the metrics port, or the admin key);
- /openapi.json, /docs, /redoc: only with `api_docs: true` (then to anyone), the
  completion endpoints included (openapi.py);
- /metrics, /v1/gateway/state, /v1/gateway/requests/recent: the operator's pages, open
  on the metrics port, behind the admin key on the API port (edge/operator_port.py);
- /admin/...: weight changes, behind the admin key;
- a completion path asked with another method than POST: 405, as the server answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from tokenfair.core.share_tree import is_group
from tokenfair.edge.endpoints import COMPLETION_PATHS
from tokenfair.edge.errors import APIError, ErrorCode, install_error_handlers
from tokenfair.edge.operator_port import on_port
from tokenfair.edge.weight_change import WeightChange
from tokenfair.gateway.flow.admission import RECENT_DISPATCHES
from tokenfair.gateway.openapi import gateway_openapi

if TYPE_CHECKING:
    from tokenfair.edge.directory import TenantDirectory
    from tokenfair.gateway.config import GatewayConfig
    from tokenfair.gateway.flow.admission import Admission
    from tokenfair.gateway.metrics import GatewayMetrics
    from tokenfair.gateway.replicas.counters import CounterStore
    from tokenfair.gateway.upstreams.pool import UpstreamPool


class SideParts(Protocol):
    """What these endpoints use of the gateway (app.Gateway has it)."""

    config: GatewayConfig
    directory: TenantDirectory
    pool: UpstreamPool
    admission: Admission
    metrics: GatewayMetrics
    stores: dict[int, CounterStore]

    async def start(self) -> None: ...

    async def close(self) -> None: ...


OPERATOR_PAGES = ("/metrics", "/health", "/v1/gateway/state", "/v1/gateway/requests/recent")
PORT_HINT = "listen.metrics_port in the gateway's config"


def side_app(gateway: SideParts) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.close()

    docs = gateway.config.api_docs
    app = FastAPI(
        title="tokenfair gateway",
        lifespan=lifespan,
        openapi_url="/openapi.json" if docs else None,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
    )
    install_error_handlers(app)
    if docs:
        app.openapi = gateway_openapi(app)  # type: ignore[method-assign]
    metrics_port = gateway.config.listen.metrics_port

    def operator(request: Request, page: str) -> None:
        if not on_port(request.scope, metrics_port):
            gateway.directory.check_operator(request.headers.get("authorization"), page, PORT_HINT)

    def is_operator(request: Request) -> bool:
        """Whether the operator asks: on the metrics port, or with the admin key (or
        without a tenants file, where the operator's pages are open)."""
        try:
            operator(request, "/health")
        except APIError:
            return False
        return True

    def tenant_key(request: Request) -> None:
        gateway.directory.authenticate(request.headers.get("authorization"), request.headers)

    def model_entry(model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "owned_by": "tokenfair-gateway"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        tenant_key(request)
        data = [model_entry(m) for m in gateway.config.served_models()]
        return {"object": "list", "data": data}

    # `:path`: a model id may hold slashes (`org/model`).
    @app.get("/v1/models/{model_id:path}")
    async def model_by_id(model_id: str, request: Request) -> dict[str, Any]:
        tenant_key(request)
        if model_id not in gateway.config.served_models():
            raise APIError(
                404,
                f"the model {model_id!r} does not exist on this gateway",
                param="model",
                code=ErrorCode.MODEL_NOT_FOUND,
            )
        return model_entry(model_id)

    for path in COMPLETION_PATHS:  # POST goes to the proxy before this app

        @app.api_route(
            path,
            methods=["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"],
            include_in_schema=False,
        )
        async def wrong_method(request: Request) -> Response:
            raise APIError(
                405,
                f"method {request.method} is not allowed on {request.url.path}",
                code=ErrorCode.METHOD_NOT_ALLOWED,
                headers={"Allow": "POST"},
            )

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        healthy = [u.name for u in gateway.pool.upstreams if u.healthy]
        if not healthy:
            raise APIError(503, "no upstream is in rotation", code=ErrorCode.NO_UPSTREAM)
        if not is_operator(request):  # a probe, or anyone: the status alone
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "ok", "upstreams": healthy})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        operator(request, "/metrics")
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/gateway/requests/recent")
    async def recent(
        request: Request,
        tenant: Annotated[str | None, Query(max_length=256)] = None,
        limit: Annotated[int, Query(ge=1, le=RECENT_DISPATCHES)] = 100,
    ) -> dict[str, Any]:
        """The last dispatched requests, oldest first: seconds waited in the gateway and
        how many requests were dispatched ahead of each while it waited."""
        operator(request, "/v1/gateway/requests/recent")
        rows = [r for r in gateway.admission.recent if tenant is None or r["tenant"] == tenant]
        return {"object": "list", "data": rows[-limit:]}

    # The admin API's weight changes, as the server's: until the next reload; a request
    # already dispatched keeps the weights it started with. `:path`: names and group
    # paths may hold slashes. The key is checked before the body is read (a dependency
    # runs first), as the server does. Replicas sharing counters through Redis each
    # hold their own weights from the tenants file: a change made on one would reach
    # that one only, while they charge one counter, so it is refused and the file named.
    def admin(authorization: str | None = Header(default=None)) -> None:
        gateway.directory.check_admin(authorization)
        if gateway.config.redis is not None:
            raise APIError(
                409,
                "this gateway shares its counters through Redis with other replicas, each "
                "holding the weights of its tenants file: a change made here would reach "
                "this replica only. Change the weight in the tenants file and reload every "
                "replica (SIGHUP)",
                code=ErrorCode.CHANGE_THE_TENANTS_FILE,
            )

    @app.post("/admin/tenants/{name:path}/weight", dependencies=[Depends(admin)])
    async def set_tenant_weight(name: str, change: WeightChange) -> dict[str, Any]:
        try:
            gateway.directory.set_weight(name, change.weight)
        except KeyError:
            raise APIError(404, f"no tenant named {name!r}", param="name") from None
        return {"name": name, "weight": change.weight}

    @app.post("/admin/groups/{path:path}/weight", dependencies=[Depends(admin)])
    async def set_group_weight(path: str, change: WeightChange) -> dict[str, Any]:
        try:
            gateway.directory.set_group_weight(path, change.weight)
        except KeyError:
            raise APIError(404, f"no group {path!r}", param="path") from None
        return {"path": path, "weight": change.weight}

    @app.get("/v1/gateway/state")
    async def state(request: Request) -> dict[str, Any]:
        """Counters, queues and upstreams (an operator's page)."""
        operator(request, "/v1/gateway/state")
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
