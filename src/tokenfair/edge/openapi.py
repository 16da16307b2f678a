"""What the server's and the gateway's OpenAPI documents share: OpenAI's error shape,
and FastAPI's 422 replaced by the 400 both answer instead (edge/errors.py)."""

from __future__ import annotations

from typing import Any

ERROR_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERROR_CONTENT: dict[str, Any] = {
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
}


def add_error_schema(schema: dict[str, Any]) -> None:
    """Put `ErrorResponse` (what ERROR_CONTENT refers to) among the components."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorResponse"] = ERROR_RESPONSE_SCHEMA


def answer_400_not_422(schema: dict[str, Any]) -> None:
    """FastAPI documents its validation error as a 422 with its own schema; the server
    and the gateway answer a bad parameter or body with a 400 in OpenAI's shape."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault(
                    "400", {"description": "Invalid parameter or body.", **ERROR_CONTENT}
                )
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
