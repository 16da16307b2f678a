"""How a request's tenant reaches its upstream, so that the engine keeps tenants apart.

The gateway sends every request with the upstream's own key, so without more the
upstream sees one client: one prefix cache for all of the gateway's tenants, where one
tenant's time to first token tells what another's prompts begin with (the side channel
per-tenant cache salts close), and, behind tokenfair's vLLM plugin or a tokenfair
server, one tenant to be fair to. Per upstream `engine` (config.py):

- `vllm`: `cache_salt` (vLLM keys its prefix cache by it) and `vllm_xargs.tenant` (vLLM
  copies `vllm_xargs` into `SamplingParams.extra_args`, where tokenfair's plugin reads
  the tenant) in the body;
- `sglang`: `cache_salt` (SGLang keys its radix cache by it);
- `tokenfair`: the header `x-tokenfair-tenant` (the server honours it from a key whose
  tenant `acts_for_tenants`, and keys its cache by that proxy and the tenant unless the
  request's `cache_salt` says otherwise);
- `openai` (the default): nothing; the body and headers go as they came.

A request meets the part of the cache the server's rule gives it (edge/cache_partition.py), sent as a
salt: a keyed hash of the tenant's name (HMAC-SHA256, 64 hex digits), the same in
every replica given the same key (`cache_salt_secret`, or else the Redis namespace),
never the name itself. A client's own `cache_salt` is hashed in with its tenant's name,
so that it partitions the tenant's own cache and can never name another tenant's. With
`share_prefix_cache: true` in the tenants file no salt is added (a tokenfair upstream is
sent one salt for all tenants, since it would otherwise keep them apart by the header).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import quote

from tokenfair.edge.cache_partition import CachePartition
from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.tenants import ACTING_HEADER
from tokenfair.gateway.transport.requests import CompletionCall, with_fields
from tokenfair.gateway.upstreams.kinds import KINDS, UpstreamKind

DEFAULT_SALT_KEY = "tokenfair"  # the Redis namespace's default


class CacheSalts:
    """Per-tenant cache salts: HMAC-SHA256 of the tenant (and the client's own salt)."""

    __slots__ = ("_key", "_memo")

    def __init__(self, key: str) -> None:
        self._key = key.encode("utf-8")
        self._memo: dict[str, str] = {}  # tenant -> its salt without a client salt

    def salt(self, tenant: str | None, client: str | None = None) -> str:
        """64 hex digits (vLLM takes at most 128, and no '@', '/', '\\\\' or NUL).
        `tenant` None: the salt all tenants share."""
        if client is None and tenant is not None:
            found = self._memo.get(tenant)
            if found is not None:
                return found
        # A JSON list: no pair of (tenant, client) reads as another.
        message = json.dumps(["tokenfair-cache-salt", tenant, client]).encode("utf-8")
        salt = hmac.new(self._key, message, hashlib.sha256).hexdigest()
        if client is None and tenant is not None and len(self._memo) < 100_000:
            self._memo[tenant] = salt
        return salt


def salt_key(secret: str | None, namespace: str | None) -> str:
    """The key of the salts: the configured secret, else the Redis namespace."""
    return secret or namespace or DEFAULT_SALT_KEY


def isolation_warning(upstreams: list[Any], directory: TenantDirectory) -> str | None:
    """A line naming the upstreams whose prefix cache the gateway's tenants share against
    the tenants file's wish (engine `openai`), or None."""
    if directory.open_mode:
        one_tenant = not directory.tenant_from_user
    else:
        one_tenant = len(directory.file.tenants) == 1
    if directory.share_prefix_cache or one_tenant:
        return None
    opaque = [u.name for u in upstreams if not KINDS[u.engine].tells_tenant]
    if not opaque:
        return None
    return (
        f"upstream(s) {', '.join(opaque)} (engine openai): the gateway cannot tell them the "
        "tenant, so their prefix cache is shared by every tenant of this gateway; set "
        "engine: vllm, sglang or tokenfair where the upstream is one (docs/gateway.md, "
        '"Tenants upstream")'
    )


def for_upstream(
    call: CompletionCall, tenant: str, engine: str, salts: CacheSalts, shared: bool
) -> tuple[bytes, dict[str, str] | None]:
    """The body and the extra headers of `call` for an upstream of kind `engine`."""
    kind = KINDS[engine]
    if not kind.tells_tenant:  # the hot path of a plain proxy: nothing to build
        return call.body, None
    forwarded = call.forwarded
    if forwarded is None:
        forwarded = call.forwarded = {}
    found = forwarded.get(engine)
    if found is None:
        found = forwarded[engine] = _build(call, tenant, kind, salts, shared)
    return found


def _build(
    call: CompletionCall, tenant: str, kind: UpstreamKind, salts: CacheSalts, shared: bool
) -> tuple[bytes, dict[str, str] | None]:
    fields: dict[str, Any] = {}
    headers: dict[str, str] | None = None
    partition = CachePartition.of(tenant, call.client_salt, shared)
    if kind.tenant_header:
        # The header names the tenant (its fairness, and by default its cache). Every
        # salt it is sent is a hash, never a tenant's name: no client's salt can select
        # the partition the server gives a tenant without one. (A name from a `user`
        # field may hold a lone surrogate: sent as is, for the server to refuse, rather
        # than failing here.)
        headers = {ACTING_HEADER: quote(tenant.encode("utf-8", "surrogatepass"), safe="")}
        if partition != CachePartition(tenant, None):  # more than the header says
            fields["cache_salt"] = salts.salt(partition.tenant, partition.salt)
    elif kind.salt_in_body and partition.tenant is not None:
        # (Shared: the client's own salt, if any, goes as it came, as vLLM keys by it.)
        fields["cache_salt"] = salts.salt(partition.tenant, partition.salt)
    if kind.tenant_in_xargs:
        fields["vllm_xargs"] = {**(call.client_xargs or {}), "tenant": tenant}
    return (with_fields(call, fields) if fields else call.body), headers
