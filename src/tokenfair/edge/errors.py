"""HTTP errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

Every error the server (and the gateway) returns goes through here, so clients written
against the OpenAI API parse them unchanged. Whatever a client sends ends in a 4xx with
a message naming the field; a 500 means a bug in the server, never bad input.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

# The OpenAI API's error type for each status we use.
DEFAULT_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_overloaded",
}


class ErrorCode(StrEnum):
    """The `code` of every error the server and the gateway answer: one set for both."""

    INVALID_API_KEY = "invalid_api_key"
    ADMIN_ONLY = "admin_only"
    INVALID_VALUE = "invalid_value"
    INVALID_JSON = "invalid_json"
    BODY_TOO_LARGE = "body_too_large"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_NOT_FOUND = "model_not_found"
    TENANT_QUEUE_FULL = "tenant_queue_full"
    OVERLOADED = "server_overloaded"
    RATE_LIMIT = "rate_limit_exceeded"
    TOO_MANY_USERS = "too_many_users"
    TOO_MANY_TENANTS = "too_many_tenants"
    TENANT_HEADER_NOT_ALLOWED = "tenant_header_not_allowed"
    TIMEOUT = "timeout"
    SHUTTING_DOWN = "shutting_down"
    CLIENT_TOO_SLOW = "client_too_slow"  # a stream's backlog passed its bound
    NO_UPSTREAM = "no_upstream"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    ENGINE_DEAD = "engine_dead"
    NO_CHAT_TEMPLATE = "no_chat_template"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    OPERATOR_ONLY = "operator_only"
    CHANGE_THE_TENANTS_FILE = "change_the_tenants_file"  # a change one replica cannot share
    INTERNAL = "internal_error"


class ClientGone(Exception):
    """The client closed its connection before its request was read."""


class APIError(Exception):
    """An error answered to the client with `status_code` and OpenAI's error shape."""

    def __init__(
        self,
        status_code: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type or DEFAULT_TYPES.get(status_code, "invalid_request_error")
        self.param = param
        self.code = str(code) if code is not None else None
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# What pydantic puts in an error's location for the member of a union it tried
# ('constrained-str', 'list[str]', 'int', ...): no field of a request has such a name.
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}


def field_path(loc: Sequence[object]) -> str:
    """('body', 'messages', 0, 'role') -> 'messages.0.role' (the request body is implied);
    ('stop', 'list[constrained-str]', 1) -> 'stop.1' (union members are not fields)."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    # A union's member tag is never first: the name before it (even `x-request-id`) stays.
    members = (p for p in parts[1:] if not ("[" in p or "-" in p or p.lower() in _UNION_TAGS))
    return ".".join([*parts[:1], *members])


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """One line naming the first bad field, and that field's path."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type", "") == "json_invalid":
        return "the request body is not valid JSON", None
    paths = [field_path(e.get("loc", ())).split(".") for e in errors]
    field = paths[0][0]
    # A value that no member of a union accepts gives an error per member, in the
    # members' order; the one that got deepest into the value says most.
    deepest = max(
        (i for i, path in enumerate(paths) if path[0] == field), key=lambda i: len(paths[i])
    )
    first, param = errors[deepest], ".".join(paths[deepest])
    kind = first.get("type", "")
    if kind == "missing":
        message = f"missing required field {param!r}" if param else "missing request body"
    else:
        reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        where = f"field {param!r}" if param else "request body"
        message = f"invalid {where}: {reason}"
    others = {path[0] for path in paths} - {field}
    if others:
        message += f" (and {len(others)} more field{'s' if len(others) > 1 else ''})"
    return message, param or None


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, expected or not, in OpenAI's shape."""

    async def on_api_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, APIError)
        return error.response()

    async def on_validation(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        message, param = validation_message(error.errors())
        return APIError(400, message, param=param, code=ErrorCode.INVALID_VALUE).response()

    async def on_http(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        status = error.status_code
        message = error.detail if isinstance(error.detail, str) else str(error.detail)
        code = None
        if status == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
            code = ErrorCode.NOT_FOUND
        elif status == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
            code = ErrorCode.METHOD_NOT_ALLOWED
        headers = dict(error.headers) if error.headers else None
        return APIError(status, message, code=code, headers=headers).response()

    async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return APIError(500, "internal server error", code=ErrorCode.INTERNAL).response()

    async def on_client_gone(request: Request, error: Exception) -> JSONResponse:
        # Nobody reads it; answered so that nothing is logged as an internal error.
        return APIError(400, "the client closed the connection before sending the body").response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(ClientGone, on_client_gone)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def shutting_down() -> APIError:
    """The answer to a request still running when the server's (or the gateway's)
    graceful shutdown ran out: uvicorn then cancels its task, which would otherwise
    vanish with a traceback in the log and, for a response not yet started, a 500."""
    return APIError(
        503, "the server is shutting down; retry on another replica or later",
        code=ErrorCode.SHUTTING_DOWN, headers={"Retry-After": "1"},
    )  # fmt: skip
