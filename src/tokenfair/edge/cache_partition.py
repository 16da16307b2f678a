"""Which part of a prefix cache a request reads and fills: the one rule the server and
the gateway both follow.

A tenant's requests meet only its own cache, unless the tenants file says
`share_prefix_cache: true`; within that, a request's own `cache_salt` divides it
further, as vLLM keys by it. A salt can only narrow what a request meets, never name
another tenant's part. The server keys its own cache by the partition
(`server/generation.py`); the gateway sends it to its upstreams as a keyed hash, never
a tenant's name (`gateway/transport/upstream_tenant.py`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CachePartition:
    """`tenant`: whose cache (None: the one every tenant shares); `salt`: the request's
    own division of it (None: none)."""

    tenant: str | None
    salt: str | None

    @classmethod
    def of(cls, tenant: str, salt: str | None, shared: bool) -> CachePartition:
        """The partition of `tenant`'s request carrying `salt`, with the tenants file's
        `share_prefix_cache` (`shared`)."""
        return cls(None if shared else tenant, salt)

    def key(self) -> str | None:
        """The partition as one string, for a cache in this process (None: the one
        every tenant shares). Tenant names hold no NUL, so the first ends the name."""
        if self.tenant is None:
            return self.salt
        return self.tenant if self.salt is None else f"{self.tenant}\0{self.salt}"
