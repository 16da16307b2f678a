"""The FastAPI application: `create_app(model, tenants, config)`.

Endpoints: /v1/completions, /v1/chat/completions (routes), /v1/models, /health,
/metrics (Prometheus text), /admin/* (admin); /openapi.json, /docs and /redoc only
when the config asks for them (`--api-docs`: they answer anyone). The engine (on a thread of
this process, or an EngineProcess already launched) starts with the app and stops with
it; on shutdown requests still in flight are aborted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.errors import APIError, install_error_handlers
from tokenfair.edge.limits import Limits
from tokenfair.edge.openapi import ERROR_CONTENT, add_error_schema, answer_400_not_422
from tokenfair.edge.operator_port import on_port
from tokenfair.engine.async_engine import AsyncEngine
from tokenfair.engine.engine import Engine
from tokenfair.engine.engine_client import EngineClient, EngineDeadError
from tokenfair.server import admin, routes
from tokenfair.server.metrics import ServerMetrics
from tokenfair.server.model import ServedModel
from tokenfair.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenfair.server.state import ServerConfig, ServerState


def create_app(
    model: ServedModel,
    tenants: TenantDirectory,
    config: ServerConfig | None = None,
    engine: EngineClient | None = None,
) -> FastAPI:
    """Without `engine`, the model's own engine steps on a thread of this process."""
    config = config or ServerConfig()
    metrics = ServerMetrics()
    metrics.tenants(t.name for t in tenants.tenants)
    metrics.tree = tenants.tree
    if engine is None:
        if model.engine is None:
            raise ValueError("a model card without its engine needs the engine it runs in")
        engine = AsyncEngine(model.engine)
    engine.on_step = metrics.on_step
    state = ServerState(
        model=model,
        engine=engine,
        tenants=tenants,
        config=config,
        metrics=metrics,
        limits=Limits(config.max_waiting_total),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            for request_id in list(engine.streams):
                engine.abort(request_id)
            await engine.stop()

    docs = config.api_docs
    app = FastAPI(
        title="tokenfair",
        summary="OpenAI-compatible LLM server with fair sharing between tenants (VTC)",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url="/openapi.json" if docs else None,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
    )
    app.state.server = state
    install_error_handlers(app)
    app.include_router(routes.router)
    app.include_router(admin.router)

    entry = {
        "id": model.name,
        "object": "model",
        "created": state.created,
        "owned_by": "tokenfair",
        "max_model_len": model.max_context,
    }

    @app.get("/v1/models", summary="The served model")
    async def models(request: Request) -> Response:
        state.tenants.authenticate(request.headers.get("authorization"), request.headers)
        return routes.json_response({"object": "list", "data": [entry]})

    # `:path`: a model id may hold slashes (`org/model`, a directory's path).
    @app.get("/v1/models/{model_id:path}", summary="One model, by id")
    async def model_by_id(model_id: str, request: Request) -> Response:
        state.tenants.authenticate(request.headers.get("authorization"), request.headers)
        if model_id != model.name:
            raise APIError(
                404,
                f"the model {model_id!r} does not exist; this server serves {model.name!r}",
                param="model",
                code="model_not_found",
            )
        return routes.json_response(entry)

    @app.get("/health", summary="200 while the engine runs, 503 otherwise; the policy's state")
    async def health(request: Request) -> Response:
        if not engine.alive:
            raise APIError(503, "the engine is not running", code="engine_dead")
        try:
            policy = await engine.call(Engine.policy_status)
        except EngineDeadError:
            raise APIError(503, "the engine is not running", code="engine_dead") from None
        # A policy that failed is reported, and the server still serves (with fcfs);
        # what it raised is the operator's to read (the metrics port, the admin key).
        if not _is_operator(request):
            policy.pop("error", None)
        return routes.json_response({"status": "ok", "policy": policy})

    def _is_operator(request: Request) -> bool:
        if on_port(request.scope, config.metrics_port):
            return True
        try:
            state.tenants.check_operator(
                request.headers.get("authorization"), "/health", "--metrics-port"
            )
        except APIError:
            return False
        return True

    @app.get(
        "/metrics",
        summary="Prometheus metrics (text format): on the metrics port, or with the admin key",
    )
    async def metrics_endpoint(request: Request) -> Response:
        if not on_port(request.scope, config.metrics_port):
            state.tenants.check_operator(
                request.headers.get("authorization"), "/metrics", "--metrics-port"
            )
        if not engine.alive:
            raise APIError(503, "the engine is not running", code="engine_dead")
        body = metrics.render(await state.snapshot())
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the request bodies the routes parse themselves."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (CompletionRequest, ChatCompletionRequest):
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
    add_error_schema(schema)
    bearer = {"type": "http", "scheme": "bearer"}
    schema["components"]["securitySchemes"] = {"bearer": bearer}
    schema["security"] = [{"bearer": []}]
    _as_answered(schema)
    app.openapi_schema = schema
    return schema


PUBLIC_PATHS = ("/health",)  # no key needed


def _as_answered(schema: dict[str, Any]) -> None:
    """Make FastAPI's generated operations say what the server really answers: a bad
    parameter or body is a 400 in OpenAI's error shape (not FastAPI's 422), the admin
    API and /metrics may answer 401, 403 and 404 too, and /health needs no key."""
    answer_400_not_422(schema)
    admin = {
        "401": "Missing or unknown key.",
        "403": "A tenant key, not the admin key.",
        "404": "No such tenant or request (or the admin API is off: no admin key is set).",
    }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            if path.startswith("/admin/") or path == "/metrics":
                for code, text in admin.items():
                    responses.setdefault(code, {"description": text, **ERROR_CONTENT})
            if path in PUBLIC_PATHS:
                operation["security"] = []
