"""The tenants file: who may send requests, in which groups, under which limits.

A YAML file lists the tenants; each has one or more API keys, stored only as sha256
hashes (`tokenfair tenants hash-key` makes one), a VTC weight, a default priority and
its limits. Tenants may be grouped into a tree (organisation -> team -> tenant), each
group with a weight among its siblings: service is then shared by weight at every
level (hierarchical VTC, docs/fairness.md). The server and the gateway read the same
file.

    admin_key_sha256: "<64 hex>"       # the admin API is off without it
    trusted_tenant_header: null        # e.g. "x-tenant"; off by default
    share_prefix_cache: false          # cross-tenant prefix-cache sharing is opt-in
    groups:                            # optional: shares by organisation and team
      org-a:
        weight: 2
        groups:
          search: {weight: 1}
    tenants:
      - name: team-a
        group: org-a/search            # the group's path; none: the top level
        key_sha256: ["<64 hex>"]
        weight: 1.0
        priority: 0
        band: 0                        # the gateway's priority band, lower first
        max_waiting: 256
        max_tokens_per_request: 8192
        timeout_s: null
        rpm: null
        acts_for_tenants: false        # a trusted proxy (a gateway): see ACTING_HEADER
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenfair.core.share_tree import ShareTree
from tokenfair.share_groups import (
    GROUP_NAME_RULE,
    MAX_GROUP_DEPTH,
    Group,
    GroupName,
    Weight,
    group_paths,
    group_weights,
    share_tree,
    too_deep,
)
from tokenfair.yaml_lines import line_of, load_with_nodes, validation_message, yaml_error

OPEN_TENANT = "default"
# The header with which a trusted proxy (a tenant with `acts_for_tenants`, such as a
# tokenfair gateway) names the tenant it sends a request for; from any other key it is
# refused (403), never ignored. Its value is the tenant's name, percent-encoded (UTF-8).
ACTING_HEADER = "x-tokenfair-tenant"
OPEN_MAX_WAITING = 1 << 30
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


# strict: a boolean is not a number here (`weight: true` is refused, not read as 1).
class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: TenantName
    group: str | None = Field(default=None, min_length=1)
    key_sha256: list[KeyHash] = Field(default_factory=list)
    weight: Weight = 1.0
    priority: int = 0
    band: int = Field(default=0, ge=0, le=100)
    max_waiting: int = Field(default=256, ge=1)
    max_tokens_per_request: int = Field(default=8192, ge=1)
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    rpm: int | None = Field(default=None, ge=1)
    # A trusted proxy: its requests may name the tenant they are for (ACTING_HEADER).
    acts_for_tenants: bool = False

    @field_validator("key_sha256", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("key_sha256")
    @classmethod
    def _lowercase(cls, value: list[str]) -> list[str]:
        return [v.lower() for v in value]


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    admin_key_sha256: KeyHash | None = None
    trusted_tenant_header: str | None = Field(
        default=None, min_length=1, pattern=r"^[A-Za-z0-9-]+$"
    )
    share_prefix_cache: bool = False
    groups: dict[GroupName, Group] = Field(default_factory=dict)
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

    # --- the tree of groups ---
    def group_paths(self) -> dict[str, tuple[str | None, float]]:
        """Every group's path -> (its parent's path or None, its weight)."""
        return group_paths(self.groups)

    def share_tree(self) -> ShareTree:
        """The groups and their tenants as the core's tree (no group: the flat tree)."""
        members = {t.name: t.group for t in self.tenants if t.group is not None}
        return share_tree(self.groups, members)

    def weights(self) -> dict[str, float]:
        """Every node's weight: tenants by name, groups by `@path`."""
        weights = group_weights(self.groups)
        weights.update({t.name: t.weight for t in self.tenants})
        return weights


class _Invalid(ValueError):
    """A mistake found after the schema: where it is (a key path) and what it is."""

    def __init__(self, loc: tuple[int | str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _check(file: TenantsFile) -> None:
    """What the schema alone cannot say: unique names and keys, groups that exist."""
    deep = too_deep(file.groups, ("groups",))
    if deep is not None:
        raise _Invalid(deep, f"groups nest at most {MAX_GROUP_DEPTH} deep")
    paths = file.group_paths()
    seen_names: set[str] = set()
    owner: dict[str, str] = {}
    for index, tenant in enumerate(file.tenants):
        if tenant.name in seen_names:
            raise _Invalid(("tenants", index, "name"), f"duplicate tenant name {tenant.name!r}")
        seen_names.add(tenant.name)
        if tenant.group is not None and tenant.group not in paths:
            known = ", ".join(sorted(paths)) or "none: the file has no 'groups'"
            raise _Invalid(
                ("tenants", index, "group"),
                f"no group {tenant.group!r} (groups are named by their path, e.g. "
                f"org-a/search; defined: {known})",
            )
        for key in tenant.key_sha256:
            if key in owner:
                raise _Invalid(
                    ("tenants", index, "key_sha256"),
                    f"key already belongs to tenant {owner[key]!r}",
                )
            if key == file.admin_key_sha256:
                raise _Invalid(
                    ("tenants", index, "key_sha256"), "the admin key cannot be a tenant key"
                )
            owner[key] = tenant.name


def _describe(error: ValidationError) -> tuple[tuple[int | str, ...], str]:
    first = error.errors()[0]
    loc = tuple(first["loc"])
    message = validation_message(first)
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    elif first["type"] == "missing":
        message = "required key missing"
    elif first["type"] == "too_short" and loc == ("tenants",):
        message = "no tenant: name at least one"
    if loc and loc[-1] == "[key]":  # a mapping's key: a group's name
        loc = loc[:-1]
        message = GROUP_NAME_RULE
    return loc, message


def parse_tenants(
    data: Any,
    source: str = "tenants file",
    root: yaml.Node | None = None,
    key_prefix: tuple[str, ...] = (),
) -> TenantsFile:
    """Validate already-parsed YAML/JSON data; errors name `source`, the key (under
    `key_prefix` when the data sits inside another file) and, given the YAML's node tree
    (`root`, the data's own node), the line."""
    if data is None:
        raise TenantsFileError(f"{source}: the file is empty: it needs a 'tenants' list")
    if not isinstance(data, dict):
        raise TenantsFileError(f"{source}: expected a mapping with a 'tenants' list")
    try:
        file = TenantsFile.model_validate(data)
        _check(file)
    except ValidationError as error:
        loc, message = _describe(error)
    except _Invalid as error:
        loc, message = error.loc, str(error)
    else:
        return file
    line = line_of(root, loc)
    where = f"{source}:{line}" if line else source
    key = ".".join(str(p) for p in (*key_prefix, *loc))
    raise TenantsFileError(f"{where}: {key}: {message}" if key else f"{where}: {message}")


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
        raise TenantsFileError(yaml_error(error, str(path))) from None
    return parse_tenants(data, str(path), root)
