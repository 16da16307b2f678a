"""What operators read, kept from tenants: /metrics and the state pages.

/metrics names every tenant with its token counts, counters and latencies, so a tenant
must not read it. Two ways to it, as operators of vLLM, LiteLLM or Envoy expect:

- the *metrics port* (`--metrics-port`, the gateway's `listen.metrics_port`): a second
  listening socket of the same process that serves only the operator's pages, without
  a key; bind it where only your monitoring reaches;
- on the API port, the admin key (`Authorization: Bearer <admin key>`); without an
  admin key in the tenants file these pages are not served there at all.

Without a tenants file (one open tenant, or `tenant_from_user` on a trusted network)
there is no tenant to hide from another, and /metrics is open on the API port too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from tokenfair.edge.errors import APIError, ErrorCode


def on_port(scope: Mapping[str, Any], port: int | None) -> bool:
    """Whether the request came in on `port` (the metrics port, when there is one)."""
    if port is None:
        return False
    server = scope.get("server")
    return server is not None and server[1] == port


def only_operator_pages(path: str, pages: Collection[str]) -> APIError:
    """The answer on the metrics port to anything but its pages."""
    return APIError(
        404,
        f"no such endpoint on the metrics port: {path} (it serves {', '.join(sorted(pages))}; "
        "the API is on the API port)",
        code=ErrorCode.NOT_FOUND,
    )
