"""The gateway's OpenAPI document (`api_docs: true`): what it answers, as it answers it.

The completion endpoints are served by the proxy before the FastAPI app sees a request
(transport/proxy.py), so FastAPI's own document would omit them; they are added here,
with the body the gateway reads (the rest of an OpenAI request goes to the upstream as
sent) and the answers it gives: the upstream's, or one of its own errors in OpenAI's
shape. FastAPI's `422` is replaced by the `400` sent instead, as in the server's
document (edge/openapi.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tokenfair.edge.endpoints import COMPLETION_PATHS
from tokenfair.edge.openapi import ERROR_CONTENT, add_error_schema, answer_400_not_422

# What the gateway itself answers on a completion path (an upstream's own error answer
# is relayed as it came).
COMPLETION_ERRORS = {
    "400": "invalid JSON, a field of the wrong type, a prompt over the tenant's or the "
    "model's limit (`invalid_json`, `invalid_value`, `context_length_exceeded`)",
    "401": "no key, or a key no tenant has (`invalid_api_key`)",
    "403": "a tenant header from a key that may not act for others (`tenant_header_not_allowed`)",
    "404": "a model no upstream serves (`model_not_found`)",
    "408": "the request waited or ran past its timeout (`timeout`)",
    "413": "a body over the gateway's limit (`body_too_large`)",
    "429": "the tenant's queue is full or its rate limit reached "
    "(`tenant_queue_full`, `rate_limit_exceeded`); `Retry-After` says when to retry",
    "502": "the upstream could not be reached or failed (`upstream_unavailable`, `upstream_error`)",
    "503": "no upstream in rotation, or the gateway is stopping (`no_upstream`, `shutting_down`)",
}
BODIES = {
    "/v1/completions": ("prompt", {"oneOf": [{"type": "string"}, {"type": "array"}]}),
    "/v1/chat/completions": ("messages", {"type": "array", "items": {"type": "object"}}),
}


def _completion(path: str) -> dict[str, Any]:
    field, schema = BODIES[path]
    body = {
        "type": "object",
        "required": ["model", field],
        "additionalProperties": True,
        "properties": {
            "model": {"type": "string"},
            field: schema,
            "max_tokens": {"type": "integer", "minimum": 1},
            "stream": {"type": "boolean"},
            "stream_options": {
                "type": "object",
                "properties": {"include_usage": {"type": "boolean"}},
            },
            "priority": {
                "type": "integer",
                "description": "the tenant's own order (lower first), within its share",
            },
        },
    }
    responses: dict[str, Any] = {
        "200": {
            "description": "the upstream's answer: a JSON body, or server-sent events "
            "ending with `data: [DONE]` when `stream` is true",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    }
    for status, description in COMPLETION_ERRORS.items():
        responses[status] = {
            "description": description,
            **ERROR_CONTENT,
        }
    return {
        "post": {
            "summary": f"OpenAI's {path}, admitted fairly among tenants",
            "operationId": path.strip("/").replace("/", "_"),
            "security": [{"tenantKey": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": responses,
        }
    }


def gateway_openapi(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The function FastAPI serves /openapi.json from (`app.openapi = ...`)."""

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            answer_400_not_422(document)
            for path in COMPLETION_PATHS:
                document.setdefault("paths", {})[path] = _completion(path)
            add_error_schema(document)
            document["components"]["securitySchemes"] = {
                "tenantKey": {"type": "http", "scheme": "bearer", "description": "a tenant's key"}
            }
            app.openapi_schema = document
        return app.openapi_schema

    return schema
