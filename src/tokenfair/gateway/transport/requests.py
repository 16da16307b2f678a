"""What the gateway reads from a completion request body; everything else passes through.

The gateway checks only the fields it schedules by (model, stream, max_tokens, the
prompt or messages, user, priority) and forwards the body as the client sent it, so
whatever the upstream supports (tools, n, response_format, its own extensions) still
works. For a stream it asks the upstream for usage (`stream_options.include_usage`),
and hides that final usage chunk again from a client that did not ask for it. For an
engine that keys its prefix cache or its fairness by fields of the body, the tenant's
`cache_salt` and `vllm_xargs.tenant` are added the same way (`with_fields`, used by
upstream_tenant.py); every other value stays as sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from tokenfair.edge.errors import APIError, ErrorCode


@dataclass(slots=True)
class CompletionCall:
    kind: str  # "chat" or "completions"
    model: str
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None
    priority: int | None
    user: str | None
    payload: Any  # messages or prompt
    body: bytes  # what is sent upstream
    # Completions the upstream generates: n per prompt (a completions prompt may be a
    # list of prompts). The gateway reserves max_tokens of output for each.
    choices: int = 1
    # The parsed body (with stream_options as sent upstream), and whether it was read by
    # the standard library's json, which a rewrite must then use too (`_loads`).
    data: dict[str, Any] | None = None
    exact: bool = False
    # The client's own cache_salt (None: none, or empty), and its vllm_xargs.
    client_salt: str | None = None
    client_xargs: dict[str, Any] | None = None
    # What went upstream per engine (body, extra headers): a retry elsewhere reuses it.
    forwarded: dict[str, tuple[bytes, dict[str, str] | None]] | None = None


def _bad(message: str, param: str | None, code: str = ErrorCode.INVALID_VALUE) -> APIError:
    return APIError(400, message, param=param, code=code)


def _int_field(data: dict[str, Any], name: str, minimum: int | None) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"invalid field {name!r}: must be an integer", name)
    if minimum is not None and value < minimum:
        raise _bad(f"invalid field {name!r}: must be >= {minimum}", name)
    return value


def _typed_field(data: dict[str, Any], name: str, kind: type) -> Any:
    """The field's value, None when absent; a 400 naming it when of another type."""
    value = data.get(name)
    if value is not None and not isinstance(value, kind):
        what = "a string" if kind is str else "an object"
        raise _bad(f"invalid field {name!r}: must be {what}", name)
    return value


# An integer longer than this may not fit in 64 bits, which orjson reads as a float.
_LONG_NUMBER = re.compile(rb"\d{20}")


def _loads(raw: bytes) -> tuple[Any, bool]:
    """The body, and whether it was read by the standard library's json, which a rewrite
    must then use too to keep it as sent: integers beyond 64 bits (orjson makes floats
    of them), NaN or lone surrogates (orjson refuses them; Python-based engines take
    them). orjson otherwise: it is several times faster."""
    if not _LONG_NUMBER.search(raw):
        try:
            return orjson.loads(raw), False
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(raw), True
    except (ValueError, RecursionError):
        raise _bad("the request body is not valid JSON", None, ErrorCode.INVALID_JSON) from None


def parse_call(raw: bytes, kind: str) -> CompletionCall:
    data, exact = _loads(raw)
    if not isinstance(data, dict):
        raise _bad("the request body must be a JSON object", None)
    model = data.get("model")
    if model is None:
        raise _bad("missing required field 'model'", "model")
    if not isinstance(model, str) or not model:
        raise _bad("invalid field 'model': must be a non-empty string (a model's id)", "model")
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("invalid field 'stream': must be a boolean", "stream")
    field = "messages" if kind == "chat" else "prompt"
    payload = data.get(field)
    if kind == "chat" and (not isinstance(payload, list) or not payload):
        raise _bad("missing required field 'messages' (a non-empty list)", "messages")
    if kind == "completions" and not isinstance(payload, str | list):
        raise _bad("missing required field 'prompt' (text or token ids)", "prompt")
    max_tokens = _int_field(data, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int_field(data, "max_tokens", 1)
    priority = _int_field(data, "priority", None)
    n = _int_field(data, "n", 1) or 1
    user = _typed_field(data, "user", str)
    options = _typed_field(data, "stream_options", dict)
    wants_usage = bool(options and options.get("include_usage"))
    salt = _typed_field(data, "cache_salt", str)
    xargs = _typed_field(data, "vllm_xargs", dict)
    body = raw
    if stream and not wants_usage:
        data["stream_options"] = {**(options or {}), "include_usage": True}
        body = _dumps(data, exact)
    return CompletionCall(
        kind, model, stream, wants_usage, max_tokens, priority, user, payload, body,
        choices=n * _prompt_count(kind, payload), data=data, exact=exact,
        client_salt=salt or None, client_xargs=xargs,
    )  # fmt: skip


def _dumps(data: dict[str, Any], exact: bool) -> bytes:
    # ASCII json: lone surrogates stay escapes.
    return json.dumps(data).encode() if exact else orjson.dumps(data)


def with_fields(call: CompletionCall, fields: dict[str, Any]) -> bytes:
    """The body sent upstream with `fields` set at its top level (replacing the client's
    values of them), every other value as it was sent."""
    assert call.data is not None
    return _dumps({**call.data, **fields}, call.exact)


def _prompt_count(kind: str, payload: Any) -> int:
    """Prompts in a completions batch (a list of strings or of token-id lists); 1 else."""
    batch = kind == "completions" and isinstance(payload, list) and payload
    if batch and all(isinstance(p, str | list) for p in payload):
        return len(payload)
    return 1
