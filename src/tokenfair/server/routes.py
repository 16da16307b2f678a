"""/v1/completions and /v1/chat/completions: authenticate, parse, prepare, run, answer.

Bodies are read with a size bound (413 beyond it), parsed with orjson and validated
with the pydantic models of `protocol`; FastAPI's own body handling is bypassed for
speed and for control over the bound, and the OpenAPI schema is declared explicitly.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from tokenfair.edge.body import read_body
from tokenfair.edge.endpoints import COMPLETION_PATHS
from tokenfair.edge.errors import APIError, ClientGone, ErrorCode, shutting_down, validation_message
from tokenfair.edge.operator_port import on_port, only_operator_pages
from tokenfair.server.answer_stream import AnswerStream
from tokenfair.server.choices import collect, start_all
from tokenfair.server.chunk_write import writer_of
from tokenfair.server.generation import prepare
from tokenfair.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenfair.server.state import ServerState

M = TypeVar("M", bound=BaseModel)
Body = CompletionRequest | ChatCompletionRequest
log = logging.getLogger(__name__)
router = APIRouter()
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it
OPERATOR_PAGES = ("/metrics", "/health")  # all the metrics port serves


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


async def read_json(receive: Receive, headers: Headers, limit: int) -> Any:
    """The body as JSON; 413 past `limit` bytes (checked before and while reading)."""
    body = await read_body(receive, limit, headers.get("content-length"))
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise APIError(
            400, "the request body is not valid JSON", code=ErrorCode.INVALID_JSON
        ) from None


def parse(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_value")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        message, param = validation_message(error.errors(include_url=False))
        raise APIError(400, message, param=param, code="invalid_value") from None


def body_schema(name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    }


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    for code, text in {
        400: "Invalid request (the message names the field).",
        401: "Missing or unknown API key.",
        404: "Unknown model.",
        408: "The request timed out.",
        413: "Request body too large.",
        429: "Tenant over its waiting limit or rate limit (see Retry-After).",
        503: "Server overloaded (see Retry-After).",
    }.items()
}


async def generate(
    state: ServerState, scope: Scope, receive: Receive, model: type[Body], kind: str
) -> Response:
    """Run one generation request; the answer is a Response (an ASGI callable)."""
    headers = Headers(scope=scope)
    caller = state.tenants.identify(headers.get("authorization"), headers)
    tenant = caller.tenant
    try:
        body = parse(model, await read_json(receive, headers, state.config.max_body_bytes))
        tenant = state.tenants.for_user(tenant, body.user)
        prepared = prepare(state, body, tenant, kind, caller.proxy)
    except APIError as error:  # a 4xx for this tenant's request: refused, not served
        state.metrics.reject(tenant.name, error.code or f"http_{error.status_code}")
        raise
    answer = await start_all(state, prepared, body.choices)
    state.answering.add(answer)  # until its close
    if body.stream:
        return AnswerStream(answer)
    whole = await collect(scope, receive, answer)
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)
    return json_response(whole, headers={"x-request-id": answer.jobs[0].request.request_id})


_BODIES: dict[str, tuple[type[Body], str]] = {
    "completions": (CompletionRequest, "cmpl"),
    "chat": (ChatCompletionRequest, "chatcmpl"),
}
HOT_PATHS = {path: _BODIES[kind] for path, kind in COMPLETION_PATHS.items()}


class FastPath:
    """ASGI app in front of FastAPI: POSTs to the generation endpoints go straight to
    `generate`, skipping the framework's middleware and dependency machinery (a large
    share of the CPU per request at thousands of requests/s); everything else, and the
    OpenAPI schema, is FastAPI's."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state: ServerState = app.state.server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = writer_of(scope)
        if writer is not None:
            writer.handler_started()  # taken in: the loop's lower-priority work may go on
        if (
            scope["type"] == "http"
            and scope["path"] not in OPERATOR_PAGES
            and on_port(scope, self.state.config.metrics_port)
        ):
            await only_operator_pages(scope["path"], OPERATOR_PAGES).response()(
                scope, receive, send
            )
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            hot = HOT_PATHS.get(scope["path"])
            if hot is not None:
                try:
                    response = await generate(self.state, scope, receive, *hot)
                except APIError as error:
                    response = error.response()
                except ClientGone:  # nobody to answer
                    return
                except asyncio.CancelledError:  # see shutting_down
                    response = shutting_down().response()
                except Exception:
                    log.exception("internal error on POST %s", scope["path"])
                    response = APIError(
                        500, "internal server error", code="internal_error"
                    ).response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


@router.post(
    "/v1/completions",
    openapi_extra=body_schema("CompletionRequest"),
    responses=ERROR_RESPONSES,
    summary="Complete a prompt (OpenAI-compatible; stream=true for server-sent events)",
)
async def completions(request: Request) -> Response:
    state = request.app.state.server
    return await generate(state, request.scope, request.receive, CompletionRequest, "cmpl")


@router.post(
    "/v1/chat/completions",
    openapi_extra=body_schema("ChatCompletionRequest"),
    responses=ERROR_RESPONSES,
    summary="Reply to a conversation (OpenAI-compatible; stream=true for server-sent events)",
)
async def chat_completions(request: Request) -> Response:
    state = request.app.state.server
    return await generate(state, request.scope, request.receive, ChatCompletionRequest, "chatcmpl")
