"""Tenants: who a request belongs to, and the limits that tenant runs under.

A YAML file lists the tenants; each has one or more API keys, stored only as sha256
hashes (`tokenfair tenants hash-key` makes one), a VTC weight, a default priority and
its limits. `Authorization: Bearer <key>` names the tenant. Nothing in the request body
can change it: not the `user` field, not a header, unless the operator names a
`trusted_tenant_header` set by an authenticating proxy in front of the server.

Without a file there is one open tenant, or, with `tenant_from_user`, one tenant per
`user` field (for trusted networks and benchmarks only: anyone can claim any user).

    admin_key_sha256: "<64 hex>"       # the admin API is off without it
    trusted_tenant_header: null        # e.g. "x-tokenfair-tenant"; off by default
    share_prefix_cache: false          # cross-tenant prefix-cache sharing is opt-in
    tenants:
      - name: team-a
        key_sha256: ["<64 hex>"]
        weight: 1.0
        priority: 0
        max_waiting: 256
        max_tokens_per_request: 8192
        timeout_s: null
        rpm: null
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tokenfair.server.errors import APIError
from tokenfair.yaml_lines import line_of, load_with_nodes

OPEN_TENANT = "default"
OPEN_MAX_WAITING = 1 << 30
# With tenant_from_user, how many distinct `user` values become tenants. Each tenant
# keeps its counters and its metric series for good: without a bound, a client that
# sends a new `user` per request would grow the server and /metrics without end.
MAX_USER_TENANTS = 10_000
KeyHash = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]
TenantName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$")
]


class TenantsFileError(ValueError):
    """A tenants file that cannot be used; the message names the file and the key."""


def hash_key(key: str) -> str:
    """The sha256 hex digest stored in the tenants file for API key `key`."""
    if not key:
        raise ValueError("an API key must not be empty")
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TenantName
    key_sha256: list[KeyHash] = Field(default_factory=list)
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    priority: int = 0
    max_waiting: int = Field(default=256, ge=1)
    max_tokens_per_request: int = Field(default=8192, ge=1)
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    rpm: int | None = Field(default=None, ge=1)

    @field_validator("key_sha256", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("key_sha256")
    @classmethod
    def _lowercase(cls, value: list[str]) -> list[str]:
        return [v.lower() for v in value]


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    admin_key_sha256: KeyHash | None = None
    trusted_tenant_header: str | None = Field(
        default=None, min_length=1, pattern=r"^[A-Za-z0-9-]+$"
    )
    share_prefix_cache: bool = False
    # Required, and never empty: a file naming nobody would lock every client out
    # (a half-written file, on a reload), which the old file in force is better than.
    tenants: list[Tenant] = Field(min_length=1)

    @field_validator("admin_key_sha256")
    @classmethod
    def _lower_admin(cls, value: str | None) -> str | None:
        return value.lower() if value else value

    @field_validator("trusted_tenant_header")
    @classmethod
    def _lower_header(cls, value: str | None) -> str | None:
        return value.lower() if value else value

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        seen_names: set[str] = set()
        owner: dict[str, str] = {}
        for index, tenant in enumerate(self.tenants):
            if tenant.name in seen_names:
                raise ValueError(f"tenants.{index}.name: duplicate tenant name {tenant.name!r}")
            seen_names.add(tenant.name)
            for key in tenant.key_sha256:
                if key in owner:
                    raise ValueError(
                        f"tenants.{index}.key_sha256: key already belongs to tenant {owner[key]!r}"
                    )
                if key == self.admin_key_sha256:
                    raise ValueError(
                        f"tenants.{index}.key_sha256: the admin key cannot be a tenant key"
                    )
                owner[key] = tenant.name
        return self


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    elif first["type"] == "missing":
        message = "required key missing"
    elif first["type"] == "too_short" and loc == "tenants":
        message = "no tenant: name at least one"
    return f"{loc}: {message}" if loc else message


def parse_tenants(
    data: Any, source: str = "tenants file", root: yaml.Node | None = None
) -> TenantsFile:
    """Validate already-parsed YAML/JSON data; errors name `source`, the key and, given
    the YAML's node tree (`root`), the line."""
    if data is None:
        raise TenantsFileError(f"{source}: the file is empty: it needs a 'tenants' list")
    if not isinstance(data, dict):
        raise TenantsFileError(f"{source}: expected a mapping with a 'tenants' list")
    try:
        return TenantsFile.model_validate(data)
    except ValidationError as error:
        line = line_of(root, tuple(error.errors()[0]["loc"]))
        where = f"{source}:{line}" if line else source
        raise TenantsFileError(f"{where}: {_describe(error)}") from None


def load_tenants(path: str | Path) -> TenantsFile:
    """Read and validate a tenants file; TenantsFileError names the file, key and reason."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TenantsFileError(f"{path}: cannot read: {error}") from None
    try:
        data, root = load_with_nodes(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise TenantsFileError(f"{path}:{where} not valid YAML") from None
    return parse_tenants(data, str(path), root)


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
    return APIError(401, message, type="invalid_request_error", code="invalid_api_key")


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
        with self._lock:
            self.file = tenants_file
            self._by_name = by_name
            self._by_key = by_key
            self._users: dict[str, Tenant] = {}

    def replace(self, tenants_file: TenantsFile) -> None:
        """Swap in a reloaded file; requests already admitted keep the tenant they had."""
        self._install(tenants_file)

    # --- queries ---
    @property
    def tenants(self) -> list[Tenant]:
        with self._lock:
            return [*self._by_name.values(), *self._users.values()]

    def get(self, name: str) -> Tenant | None:
        with self._lock:
            return self._by_name.get(name) or self._users.get(name)

    @property
    def share_prefix_cache(self) -> bool:
        return self.file.share_prefix_cache

    @property
    def admin_enabled(self) -> bool:
        return self.file.admin_key_sha256 is not None

    # --- authentication ---
    def authenticate(self, authorization: str | None, headers: Mapping[str, str]) -> Tenant:
        """The tenant a request belongs to; APIError 401 for a missing or unknown key."""
        if self.open_mode:
            return self._by_name[OPEN_TENANT]
        trusted = self.file.trusted_tenant_header
        if trusted is not None:
            claimed = _header(headers, trusted)
            if claimed is not None:
                tenant = self.get(claimed.strip())
                if tenant is None:
                    raise _unauthorized(f"unknown tenant {claimed.strip()!r} in header {trusted}")
                return tenant
        key = bearer_key(authorization)
        if key is None:
            raise _unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
        name = self._by_key.get(hash_key(key))
        if name is None:
            raise _unauthorized("incorrect API key")
        return self._by_name[name]

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
                        code="too_many_users",
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
            raise APIError(403, "a tenant key cannot use the admin API", code="admin_only")
        raise _unauthorized("incorrect admin key")

    # --- run-time changes (admin API) ---
    def set_weight(self, name: str, weight: float) -> Tenant:
        """Change a tenant's weight until the next reload; KeyError if unknown."""
        if not weight > 0 or weight == float("inf"):
            raise ValueError("weight must be a finite number > 0")
        with self._lock:
            if name in self._by_name:
                tenant = self._by_name[name] = self._by_name[name].model_copy(
                    update={"weight": weight}
                )
            elif name in self._users:
                tenant = self._users[name] = self._users[name].model_copy(update={"weight": weight})
            else:
                raise KeyError(name)
            return tenant
