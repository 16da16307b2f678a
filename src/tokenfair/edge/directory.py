"""Which tenant sent a request: API keys, the trusted header, the admin key.

Built from a tenants file (`edge/tenants.py`); thread-safe and replaced in place on a
reload. It also holds what an operator may change at run time until the next reload:
any tenant's or group's weight.

A key whose tenant `acts_for_tenants` (a trusted proxy: a tokenfair gateway) may name,
in the header `x-tokenfair-tenant`, the tenant a request is for: the file's tenant of
that name, or one made from the proxy's own entry (its weight and limits, at the top
level of the tree). The header from any other key, or without a tenants file, is a
403 naming the problem: never silently ignored, so that a misconfigured proxy is
noticed at its first request instead of sharing one tenant among all of its own.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from tokenfair.core.share_tree import group_id, tree_change
from tokenfair.core.weights import check_weight
from tokenfair.edge.errors import APIError, ErrorCode
from tokenfair.edge.tenants import (
    ACTING_HEADER,
    OPEN_MAX_WAITING,
    OPEN_TENANT,
    Tenant,
    TenantsFile,
    TenantsFileError,
    hash_key,
)

# With tenant_from_user, how many distinct `user` values become tenants. Each tenant
# keeps its counters and its metric series for good: without a bound, a client that
# sends a new `user` per request would grow the server and /metrics without end.
MAX_USER_TENANTS = 10_000
# How many tenants proxies may name that the tenants file does not list, for the same
# reason; and the longest such name.
MAX_ACTED_TENANTS = 10_000
MAX_ACTED_NAME = 256


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request is for (`tenant`: fairness, limits, metrics) and, when a trusted
    proxy sent it on that tenant's behalf, the proxy's own tenant."""

    tenant: Tenant
    proxy: Tenant | None = None


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, or None."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    key = key.strip()
    return key or None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if key.lower() == name:
                return candidate
    return value


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, type="invalid_request_error", code=ErrorCode.INVALID_API_KEY)


def _acting_refused(why: str) -> APIError:
    return APIError(
        403,
        f"the header {ACTING_HEADER} names the tenant a trusted proxy sends a request for; {why}",
        code=ErrorCode.TENANT_HEADER_NOT_ALLOWED,
    )


class TenantDirectory:
    """Answers "which tenant sent this request?"; thread-safe, reloadable in place."""

    def __init__(self, tenants_file: TenantsFile, *, tenant_from_user: bool = False) -> None:
        self._lock = threading.Lock()
        self.open_mode = False
        self.tenant_from_user = tenant_from_user
        self._install(tenants_file)

    @classmethod
    def open(cls, tenant_from_user: bool = False) -> TenantDirectory:
        """No tenants file: every request is the open tenant's, or its `user` field's."""
        # One tenant is the whole server: only the global waiting limit applies to it.
        open_tenant = Tenant(name=OPEN_TENANT, max_waiting=OPEN_MAX_WAITING)
        directory = cls(TenantsFile(tenants=[open_tenant]), tenant_from_user=tenant_from_user)
        directory.open_mode = True
        return directory

    def _install(self, tenants_file: TenantsFile) -> None:
        by_name = {t.name: t for t in tenants_file.tenants}
        by_key = {key: t.name for t in tenants_file.tenants for key in t.key_sha256}
        groups = {path: weight for path, (_, weight) in tenants_file.group_paths().items()}
        tree = tenants_file.share_tree()
        with self._lock:
            self.file = tenants_file
            self.tree = tree
            self._by_name = by_name
            self._by_key = by_key
            self._group_weights = groups
            self._users: dict[str, Tenant] = {}
            self._acted: dict[str, Tenant] = {}  # named by proxies, not in the file

    def replace(self, tenants_file: TenantsFile) -> None:
        """Swap in a reloaded file; requests already admitted keep the tenant they had.

        TenantsFileError if it moves a tenant or a group to another parent, or adds
        groups to a flat file or removes them all: the scheduler's tree keeps its
        shape while it runs (restart to reshape it); new tenants and groups, removed
        ones and new weights are fine."""
        problem = tree_change(self.tree, tenants_file.share_tree())
        if problem is not None:
            raise TenantsFileError(f"{problem}: restart to apply a new shape of the group tree")
        self._install(tenants_file)

    # --- queries ---
    @property
    def tenants(self) -> list[Tenant]:
        with self._lock:
            return [*self._by_name.values(), *self._users.values(), *self._acted.values()]

    def get(self, name: str) -> Tenant | None:
        with self._lock:
            return self._by_name.get(name) or self._users.get(name) or self._acted.get(name)

    @property
    def share_prefix_cache(self) -> bool:
        return self.file.share_prefix_cache

    @property
    def admin_enabled(self) -> bool:
        return self.file.admin_key_sha256 is not None

    # --- authentication ---
    def authenticate(self, authorization: str | None, headers: Mapping[str, str]) -> Tenant:
        """The tenant a request belongs to; APIError 401 for a missing or unknown key, 403
        for the acting header from a key that may not send it."""
        return self.identify(authorization, headers).tenant

    def identify(self, authorization: str | None, headers: Mapping[str, str]) -> Caller:
        """The tenant a request is for and, when a trusted proxy acts for it, the proxy;
        APIError 401 for a missing or unknown key, 403 for the acting header
        (`x-tokenfair-tenant`) from a key whose tenant does not `acts_for_tenants`."""
        acting = _header(headers, ACTING_HEADER) if headers else None
        if self.open_mode:
            if acting is not None:
                raise _acting_refused(
                    "this server has no tenants file, so no key may act for tenants: give "
                    "it one in which the proxy's key has acts_for_tenants: true"
                )
            return Caller(self._by_name[OPEN_TENANT])
        trusted = self.file.trusted_tenant_header
        if trusted is not None:
            claimed = _header(headers, trusted)
            if claimed is not None:
                tenant = self.get(claimed.strip())
                if tenant is None:
                    raise _unauthorized(f"unknown tenant {claimed.strip()!r} in header {trusted}")
                if acting is not None and trusted != ACTING_HEADER:
                    raise _acting_refused(f"a request named by {trusted} cannot send it")
                return Caller(tenant)
        key = bearer_key(authorization)
        if key is None:
            raise _unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
        name = self._by_key.get(hash_key(key))
        if name is None:
            raise _unauthorized("incorrect API key")
        tenant = self._by_name[name]
        if acting is None:
            return Caller(tenant)
        if not tenant.acts_for_tenants:
            raise _acting_refused(
                f"tenant {name!r} may not send it (only a key whose tenant has "
                "acts_for_tenants: true in the tenants file, such as a gateway's)"
            )
        return Caller(self._acted_for(tenant, acting), proxy=tenant)

    def _acted_for(self, proxy: Tenant, value: str) -> Tenant:
        """The tenant a proxy names: the file's, or one made from the proxy's entry."""
        name = value.strip()
        if "%" in name:
            try:
                name = unquote(name, errors="strict")
            except UnicodeDecodeError:
                name = ""
        if not name or len(name) > MAX_ACTED_NAME or not name.isprintable():
            raise APIError(
                400,
                f"the header {ACTING_HEADER} must name a tenant: 1 to {MAX_ACTED_NAME} "
                "printable characters, percent-encoded (UTF-8)",
                code=ErrorCode.INVALID_VALUE,
            )
        with self._lock:
            found = self._by_name.get(name) or self._acted.get(name)
            if found is not None:
                return found
            if len(self._acted) >= MAX_ACTED_TENANTS:
                raise APIError(
                    429,
                    f"proxies already named {MAX_ACTED_TENANTS} tenants that the tenants "
                    "file does not list, the most this server keeps; list them in the file",
                    code=ErrorCode.TOO_MANY_TENANTS,
                )
            # The proxy's own settings (weight, priority, limits) under the tenant's name,
            # at the top level: a group's share would need the tree reshaped.
            template = proxy.model_dump()
            template.update(name=name, group=None, key_sha256=[], acts_for_tenants=False)
            found = self._acted[name] = Tenant.model_construct(**template)
            return found

    def for_user(self, tenant: Tenant, user: str | None) -> Tenant:
        """With `tenant_from_user` and no file, the `user` field names the tenant.

        Otherwise the authenticated tenant stands: `user` is only a label.
        """
        if not (self.open_mode and self.tenant_from_user) or not user:
            return tenant
        with self._lock:
            found = self._users.get(user)
            if found is None:
                if len(self._users) >= MAX_USER_TENANTS:
                    raise APIError(
                        429,
                        f"this server already serves {MAX_USER_TENANTS} distinct users, the "
                        "most that --tenant-from-user takes; a tenants file names tenants "
                        "without a bound",
                        param="user",
                        code=ErrorCode.TOO_MANY_USERS,
                    )
                found = Tenant.model_construct(**{**tenant.model_dump(), "name": user})
                self._users[user] = found
            return found

    def check_admin(self, authorization: str | None) -> None:
        """Let an admin request through, or raise 404 (no admin key set), 401 or 403."""
        expected = self.file.admin_key_sha256
        if expected is None:
            raise APIError(
                404, "the admin API is disabled: set admin_key_sha256 in the tenants file"
            )
        key = bearer_key(authorization)
        if key is None:
            raise _unauthorized("missing admin key: send the header 'Authorization: Bearer <key>'")
        digest = hash_key(key)
        if hmac.compare_digest(digest, expected):
            return
        if digest in self._by_key:
            raise APIError(403, "a tenant key cannot use the admin API", code=ErrorCode.ADMIN_ONLY)
        raise _unauthorized("incorrect admin key")

    def check_operator(self, authorization: str | None, page: str, port_hint: str) -> None:
        """Let a request for an operator's page (/metrics, the state) through on the API
        port (edge/operator_port.py): open without a tenants file, else only to the
        admin key; without an admin key, 404 saying where the page is (`port_hint`)."""
        if self.open_mode:
            return
        if self.file.admin_key_sha256 is None:
            raise APIError(
                404,
                f"{page} shows every tenant's usage, so this port does not serve it without "
                f"the admin key: read it on the metrics port ({port_hint}), or set "
                "admin_key_sha256 in the tenants file and send that key",
                code=ErrorCode.OPERATOR_ONLY,
            )
        self.check_admin(authorization)

    @property
    def groups(self) -> dict[str, float]:
        """Every group's path and weight."""
        with self._lock:
            return dict(self._group_weights)

    def weights(self) -> dict[str, float]:
        """Every node's weight for the scheduler: tenants by name, groups by `@path`."""
        with self._lock:
            weights = {group_id(path): w for path, w in self._group_weights.items()}
            weights.update({t.name: t.weight for t in self._by_name.values()})
            weights.update({t.name: t.weight for t in self._users.values()})
            weights.update({t.name: t.weight for t in self._acted.values()})
            return weights

    def path_weights(self, tenant: Tenant) -> tuple[tuple[str, float], ...]:
        """(node, weight) down the tenant's path: its groups (`@path`), then itself."""
        if self.tree.flat:
            return ((tenant.name, tenant.weight),)
        with self._lock:
            groups = self.tree.path(tenant.name)[:-1]
            above = tuple((node, self._group_weights.get(node[1:], 1.0)) for node in groups)
        return (*above, (tenant.name, tenant.weight))

    # --- run-time changes (admin API) ---
    def set_group_weight(self, path: str, weight: float) -> None:
        """Change a group's weight until the next reload; KeyError if unknown,
        ValueError outside the weights' range (core/weights.py)."""
        weight = check_weight(weight)
        with self._lock:
            if path not in self._group_weights:
                raise KeyError(path)
            self._group_weights[path] = weight

    def set_weight(self, name: str, weight: float) -> Tenant:
        """Change a tenant's weight until the next reload; KeyError if unknown,
        ValueError outside the weights' range (core/weights.py)."""
        weight = check_weight(weight)
        with self._lock:
            if name in self._by_name:
                tenant = self._by_name[name] = self._by_name[name].model_copy(
                    update={"weight": weight}
                )
            elif name in self._users:
                tenant = self._users[name] = self._users[name].model_copy(update={"weight": weight})
            elif name in self._acted:
                tenant = self._acted[name] = self._acted[name].model_copy(update={"weight": weight})
            else:
                raise KeyError(name)
            return tenant
