"""The kinds of upstream the gateway speaks to (an upstream's `engine:`), one object
each: how a request's tenant reaches it (transport/upstream_tenant.py), whether it keys
its prefix cache by a salt in the body, and the prefix of its Prometheus metrics (its
load, followed with `capacity_from_metrics`). A new kind is one object here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

EngineName = Literal["openai", "vllm", "sglang", "tokenfair"]
# capacity_from_metrics: none, or a kind whose /metrics the gateway reads.
MetricsFlavour = Literal["none", "vllm", "tokenfair"]


@dataclass(frozen=True, slots=True)
class UpstreamKind:
    name: str
    salt_in_body: bool  # keys its prefix cache by `cache_salt` in the body
    tenant_in_xargs: bool  # reads the tenant from `vllm_xargs.tenant` (tokenfair's plugin)
    tenant_header: bool  # reads the tenant from the x-tokenfair-tenant header
    metrics_prefix: str | None  # its /metrics series' prefix; None: not followed

    @property
    def tells_tenant(self) -> bool:
        """Whether the gateway tells it the tenant at all (openai: the body and headers
        go as they came, and its prefix cache is shared by every tenant)."""
        return self.salt_in_body or self.tenant_header


KINDS: dict[str, UpstreamKind] = {
    kind.name: kind
    for kind in (
        UpstreamKind("openai", False, False, False, None),
        UpstreamKind("vllm", True, True, False, "vllm:"),
        UpstreamKind("sglang", True, False, False, None),
        UpstreamKind("tokenfair", False, False, True, "tokenfair:"),
    )
}

# The config's names are these objects' (a kind added above and not to the Literal, or
# the other way, fails at import).
assert set(get_args(EngineName)) == set(KINDS)
assert set(get_args(MetricsFlavour)) == {"none"} | {
    name for name, kind in KINDS.items() if kind.metrics_prefix
}
