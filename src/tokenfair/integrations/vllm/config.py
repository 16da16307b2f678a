"""The plugin's settings, read from vLLM's `--additional-config`.

Inline, a file, or a file plus inline overrides:

    --additional-config '{"tokenfair": {"policy": "wvtc", "weights": {"team-a": 2}}}'
    --additional-config '{"tokenfair": {"groups": {"org-a": {"weight": 2}, "org-b": {}},
                                        "tenant_groups": {"team-a": "org-a"}}}'
    --additional-config '{"tokenfair": "/etc/tokenfair/vllm.yaml"}'
    --additional-config '{"tokenfair": {"file": "/etc/tokenfair/vllm.yaml", "log_interval_s": 0}}'
    --additional-config '{"tokenfair": {"policy": "mypkg.fair:MyPolicy(half_life=30)"}}'
    --additional-config '{"tokenfair": {"tenants_file": "/etc/tokenfair/tenants/tenants.yaml"}}'

A file holds the same keys (JSON, or YAML when PyYAML is installed, as it is with
vLLM). Without a `tokenfair` key every default applies: VTC, every tenant weight 1,
service = 1 x prompt + 2 x output tokens. Every mistake is one `PluginConfigError`
line naming the key (and the file).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tokenfair.core.cost import make_cost
from tokenfair.core.policies import Policy, PolicyError, make_policy
from tokenfair.core.policies.catalog import BUILTINS, VLLM_POLICIES, usage
from tokenfair.core.policies.loading import is_user_spec, needs_of
from tokenfair.core.share_tree import ShareTree, ShareTreeError
from tokenfair.edge.tenants import TenantsFileError, load_tenants
from tokenfair.integrations.vllm.policies import PluginPolicy, plugin_policy
from tokenfair.share_groups import Group, GroupName, Weight, group_weights, share_tree

CONFIG_KEY = "tokenfair"


class PluginConfigError(ValueError):
    """A plugin setting that cannot be used; the message names the key."""


class PluginConfig(BaseModel):
    # strict: a boolean is not a number (`"w_out": true` is refused, not read as 1)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    policy: str = "vtc"
    # The tenants file the gateway (or `tokenfair serve`) reads: the weights and groups
    # come from it, and it is re-read when it changes, every `tenants_reload_s` at most
    # (0: read once). Refused together with `weights`, `groups` or `tenant_groups`.
    tenants_file: str | None = Field(None, min_length=1)
    tenants_reload_s: float = Field(5.0, ge=0)
    weights: dict[str, Weight] = Field(default_factory=dict)
    # Hierarchical shares: a tree of groups with weights (the tenants file's `groups:`)
    # and each tenant's group by path; tenants not named sit at the top level.
    groups: dict[GroupName, Group] = Field(default_factory=dict)
    tenant_groups: dict[str, str] = Field(default_factory=dict)
    cost: Literal["linear", "profiled"] = "linear"
    w_in: float = Field(1.0, ge=0)
    w_out: float = Field(2.0, ge=0)
    # Where the tenant comes from: SamplingParams.extra_args[tenant_field]
    # (OpenAI requests: "vllm_xargs": {"tenant": "..."}).
    tenant_field: str = Field("tenant", min_length=1)
    default_tenant: str = Field("default", min_length=1)
    # What a prompt token served from vLLM's prefix cache costs a tenant, as a share of
    # a computed one (1: the prompt as sent, the paper's cost; 0: only what is computed).
    charge_cached_tokens: float | None = Field(None, ge=0, le=1)
    # The older switch for the same: true is 1, false is 0.
    charge_prefix_hits: bool | None = None
    # Memory victims by what tenants hold: when vLLM runs short of KV blocks, the newest
    # request of the tenant holding the most blocks per unit of weight goes first, then
    # the policy's own order (the VTC family; docs/vllm.md, "What a tenant holds").
    share_memory: bool = True
    # The step's prompt tokens shared while more than one tenant has work: the running
    # prefills' chunks take at most this many tokens of a step together, by weight, and
    # a request starting with its whole prompt runs at once (core/step_share.py;
    # docs/vllm.md, "What a tenant holds"); null: vLLM fills the step as it would.
    step_share_tokens: int | None = Field(768, ge=1)
    # A per-tenant status line in vLLM's log every this many seconds while busy; 0: off.
    log_interval_s: float = Field(10.0, ge=0)
    # Serve per-tenant Prometheus metrics from the engine process on this port
    # (+ the data-parallel rank); null: off.
    metrics_port: int | None = Field(None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _one_cached_token_charge(self) -> PluginConfig:
        share, switch = self.charge_cached_tokens, self.charge_prefix_hits
        if share is not None and switch is not None and share != float(switch):
            raise ValueError(
                "charge_prefix_hits and charge_cached_tokens disagree: set "
                "charge_cached_tokens alone (charge_prefix_hits is its older switch)"
            )
        return self

    @model_validator(mode="after")
    def _weights_from_one_place(self) -> PluginConfig:
        inline = [k for k in ("weights", "groups", "tenant_groups") if getattr(self, k)]
        if self.tenants_file is not None and inline:
            raise ValueError(
                f"{inline[0]} is given beside tenants_file: the weights and groups come from "
                "the tenants file; set them there"
            )
        return self

    def shares(self) -> tuple[dict[str, float], ShareTree]:
        """Every node's weight (tenants by name, groups by `@path`) and the tree: from
        the tenants file when one is named, else from the inline settings."""
        if self.tenants_file is not None:
            try:
                file = load_tenants(self.tenants_file)
            except TenantsFileError as error:
                raise PluginConfigError(f"{CONFIG_KEY}.tenants_file: {error}") from None
            return file.weights(), file.share_tree()
        try:
            tree = share_tree(self.groups, self.tenant_groups)
        except ShareTreeError as error:
            raise PluginConfigError(f"{CONFIG_KEY}.tenant_groups: {error}") from None
        return {**group_weights(self.groups), **self.weights}, tree

    @property
    def cached_token_share(self) -> float:
        """What a cached prompt token costs, as a share of a computed one."""
        if self.charge_cached_tokens is not None:
            return self.charge_cached_tokens
        return 1.0 if self.charge_prefix_hits is None else float(self.charge_prefix_hits)

    @property
    def policy_name(self) -> str:
        """The policy's name without its arguments ("sjf:20" -> "sjf"); a user's class
        keeps its spec ("mypkg.mod:MyPolicy(x=1)")."""
        if self.user_policy:
            return self.policy.strip()
        return self.policy.strip().partition(":")[0].lower()

    @property
    def user_policy(self) -> bool:
        """A policy class of the user's (`mypkg.mod:MyPolicy`, or installed by name),
        run as the core's own policies are (plugin_policy)."""
        return is_user_spec(self.policy)

    def make_plugin_policy(self) -> PluginPolicy:
        """The policy as the plugin runs it inside vLLM (one per engine core)."""
        return plugin_policy(self.policy_name, self.make_policy())

    def make_policy(self) -> Policy:
        """The tokenfair policy these settings describe."""
        name = self.policy_name
        runs_here = needs_of(self.policy).vllm if self.user_policy else name in VLLM_POLICIES
        if not runs_here:
            raise PluginConfigError(
                f"{CONFIG_KEY}.policy: {self.policy!r} is not supported inside vLLM; "
                f"use one of {', '.join(usage(VLLM_POLICIES))}, or your own policy class "
                "as package.module:ClassName"
            )
        weights, tree = self.shares()
        declared = BUILTINS.get(name)
        if declared is not None and declared.needs.weights_required and not weights:
            raise PluginConfigError(f"{CONFIG_KEY}.weights: policy {name!r} needs tenant weights")
        try:
            cost = make_cost(self.cost, self.w_in, self.w_out)
            return make_policy(
                self.policy,
                weights=weights or None,
                cost=cost,
                tree=tree,
                charge_cached_tokens=self.cached_token_share,
            )
        except (PolicyError, ValueError) as error:
            raise PluginConfigError(f"{CONFIG_KEY}.policy: {error}") from None


def _describe(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in (CONFIG_KEY, *first["loc"]))
    message = str(first["msg"]).removeprefix("Value error, ")
    if isinstance(first.get("input"), bool) and first["type"] in ("float_type", "int_type"):
        message = f"expected a number, got the boolean {str(first['input']).lower()}"
    return f"{source}: {where}: {message}"


class _DuplicateKey(ValueError):
    """A key given twice in one JSON object (json.loads would keep the last)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(f"the key {key!r} is given twice in one object; give it once")
        found[key] = value
    return found


def _read_file(path: str) -> dict[str, Any]:
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except OSError as error:
        raise PluginConfigError(
            f"{CONFIG_KEY}: cannot read config file {file}: {error.strerror}"
        ) from None
    if file.suffix in (".yaml", ".yml"):
        import yaml

        from tokenfair.yaml_lines import safe_load, yaml_error

        try:
            data = safe_load(text)  # a key given twice is refused at its line
        except yaml.YAMLError as error:
            raise PluginConfigError(yaml_error(error, str(file))) from None
    else:
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKey as error:
            raise PluginConfigError(f"{file}: {error}") from None
        except json.JSONDecodeError as error:
            raise PluginConfigError(f"{file}:{error.lineno}: invalid JSON: {error.msg}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PluginConfigError(f"{file}: expected a mapping of tokenfair settings")
    return data


def load_plugin_config(additional_config: Mapping[str, Any] | None) -> PluginConfig:
    """Settings from vLLM's `additional_config` (its `tokenfair` entry)."""
    entry = (additional_config or {}).get(CONFIG_KEY)
    source = "--additional-config"
    values: dict[str, Any] = {}
    if isinstance(entry, str):
        values, source = _read_file(entry), entry
    elif isinstance(entry, Mapping):
        inline = dict(entry)
        path = inline.pop("file", None)
        if path is not None:
            if not isinstance(path, str):
                raise PluginConfigError(f"{CONFIG_KEY}.file: expected a path")
            values, source = _read_file(path), f"{path} (+ --additional-config)"
        values.update(inline)
    elif entry is not None:
        raise PluginConfigError(
            f"{CONFIG_KEY}: expected a mapping of settings or a file path, got {entry!r}"
        )
    try:
        config = PluginConfig(**values)
    except ValidationError as error:
        raise PluginConfigError(_describe(error, source)) from None
    config.make_policy()  # fail at startup, not on the first request
    return config
