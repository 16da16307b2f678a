"""What the plugin reads from a vLLM request's `SamplingParams.extra_args`.

- the tenant, under `tenant_field` (default "tenant"): OpenAI clients send
  `"vllm_xargs": {"tenant": "team-a"}`, offline code passes
  `SamplingParams(extra_args={"tenant": "team-a"})`. A missing or empty value means the
  default tenant; a number is taken as its decimal text; anything else (a list, a
  mapping) also falls back to the default tenant, with a warning, because the scheduler
  must never fail a request vLLM has already accepted;
- an optional output-length hint `predicted_output_tokens` (a positive integer) for
  the `sjf` and `vtc-predict` policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HINT_FIELD = "predicted_output_tokens"


def tenant_of(
    extra_args: Mapping[str, Any] | None, field: str, default: str
) -> tuple[str, str | None]:
    """(tenant, problem): `problem` says why the default was used for a bad value."""
    if not extra_args:
        return default, None
    value = extra_args.get(field)
    if value is None:
        return default, None
    if isinstance(value, str):
        value = value.strip()
        return (value, None) if value else (default, None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value), None
    return default, f"extra_args[{field!r}] must be a string, got {type(value).__name__}"


def output_hint_of(extra_args: Mapping[str, Any] | None) -> int | None:
    """The request's own output-length prediction, if it carries a usable one."""
    if not extra_args:
        return None
    value = extra_args.get(HINT_FIELD)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
