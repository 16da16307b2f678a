"""The gateway's configuration file (YAML), validated with pydantic.

Every mistake is reported in one line naming the file, the key (dotted path) and, when
the YAML parser knows it, the line: ``gateway.yaml:7: upstreams.0.max_concurrent: ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from tokenfair.core.policies.catalog import PER_REPLICA_POLICIES, SHARED_COUNTER_LIFTS, usage
from tokenfair.edge.defaults import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_READ_TIMEOUT_S,
)
from tokenfair.gateway.upstreams.kinds import EngineName, MetricsFlavour
from tokenfair.yaml_lines import line_of, load_with_nodes, validation_message, yaml_error

# Policies whose counters can be shared between gateway replicas (the store's VTC).
# The counter policies whose counters the replicas share (with their lift rules), and
# those each replica runs on its own: as the policies declare them (core/policies/).
SHARED_COUNTER_POLICIES = SHARED_COUNTER_LIFTS
LOCAL_POLICIES = PER_REPLICA_POLICIES


class GatewayConfigError(ValueError):
    """A config file that cannot be used; the message names the file and key."""


class _Strict(BaseModel):
    # strict: a boolean is not a number (`max_concurrent: true` is refused, not read as 1)
    model_config = ConfigDict(extra="forbid", strict=True)


class _At(ValueError):
    """A mistake with its key path under the field (`(3, "url")`), for its line."""

    def __init__(self, loc: tuple[int | str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class ListenConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # A second port serving /metrics, /health and the state pages only, without a key
    # (edge/operator_port.py); without it, those need the admin key on `port` when a
    # tenants file is given.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str | None = None  # default: host

    @model_validator(mode="after")
    def _two_ports(self) -> ListenConfig:
        # The application tells the two apart by the port a request came in on.
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise ValueError(f"metrics_port must differ from port ({self.port})")
        if self.metrics_host is not None and self.metrics_port is None:
            raise ValueError("metrics_host is the address of metrics_port: give metrics_port too")
        return self


class RedisConfig(_Strict):
    url: str = "redis://127.0.0.1:6379/0"
    namespace: str = Field(default="tokenfair", min_length=1)
    timeout_s: float = Field(default=0.25, gt=0)  # short: a dead Redis holds no sync up
    # Counters merge after `sync_every` dispatches, `flush_interval_s` to `heartbeat_s` apart.
    flush_interval_s: float = Field(default=0.05, gt=0)
    heartbeat_s: float = Field(default=1.0, gt=0)
    sync_every: int = Field(default=16, ge=1)
    gateway_ttl_s: float = Field(default=5.0, gt=0)
    # The upstreams' capacity is shared by the replicas using this Redis, as leases
    # (gateway/replicas/leases.py); false: each replica has the whole capacity to itself.
    share_capacity: bool = True

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        if not url.startswith("unix://"):
            _host_and_port(url)
        return url


def _host_and_port(url: str) -> None:
    """A URL's host and port must read as such (a bad port otherwise fails at start)."""
    parts = urlsplit(url)
    try:
        port = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError:
        raise ValueError(f"{url!r} has no valid port: a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host")
    if port == 0:
        raise ValueError(f"{url!r} has no valid port: a number from 1 to 65535")


class UpstreamConfig(_Strict):
    url: str
    name: str | None = None
    models: list[str] = Field(min_length=1)
    max_concurrent: int | None = Field(default=None, ge=1)
    max_inflight_tokens: int | None = Field(default=None, ge=1)
    # Follow the upstream's own load from its /metrics: vLLM's num_requests_running /
    # num_requests_waiting, or tokenfair's.
    capacity_from_metrics: MetricsFlavour = "none"
    api_key: str | None = None
    health_path: str = "/health"
    # What the upstream is, which says how a request's tenant reaches it
    # (gateway/upstreams/kinds.py, transport/upstream_tenant.py): `vllm`, the default (cache_salt, vllm_xargs.tenant:
    # vLLM honours both, SGLang and tokenfair serve take the salt and ignore the rest),
    # `sglang` (cache_salt), `tokenfair` (the x-tokenfair-tenant header; api_key must be
    # a key whose tenant acts_for_tenants there), or `openai`: a server that refuses
    # fields it does not know, sent the body and headers as they came, its prefix cache
    # then shared by the gateway's tenants (the gateway warns at start).
    engine: EngineName = "vllm"

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        _host_and_port(url)
        url = url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @model_validator(mode="after")
    def _capacity(self) -> UpstreamConfig:
        if self.max_concurrent is None and self.max_inflight_tokens is None:
            raise ValueError("give a capacity: max_concurrent and/or max_inflight_tokens")
        if self.capacity_from_metrics != "none" and self.max_concurrent is None:
            raise ValueError(
                "capacity_from_metrics needs max_concurrent (the upstream's batch size)"
            )
        return self


class ModelConfig(_Strict):
    # A local tokenizer directory (or hub name already in the cache) to count prompts with.
    tokenizer: str | None = None


class CostConfig(_Strict):
    w_in: float = Field(default=1.0, ge=0)
    w_out: float = Field(default=2.0, ge=0)
    # What a prompt token the upstream served from its prefix cache (its usage's
    # prompt_tokens_details.cached_tokens) costs, as a share of a computed one.
    charge_cached_tokens: float = Field(default=1.0, ge=0, le=1)


class HealthConfig(_Strict):
    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    fail_after: int = Field(default=2, ge=1)
    metrics_interval_s: float = Field(default=0.5, gt=0)


ROUTING_MODES = ("prefix-affinity", "least-loaded")


class RoutingConfig(_Strict):
    """Which upstream an admitted request goes to (gateway/upstreams/routing.py).

    `routing: least-loaded` or `routing: prefix-affinity` names the mode with the
    defaults below; a mapping sets them too.
    """

    mode: Literal["prefix-affinity", "least-loaded"] = "prefix-affinity"
    # The preferred upstream (the longest prefix, or the home of a new one) is passed
    # over when its fill (fraction of capacity) is above the least-loaded upstream's
    # plus this: 0 prefers it only when it is as empty as the emptiest, 1 whenever it
    # has room.
    overload_bound: float = Field(default=0.25, ge=0, le=1)
    # Prompt bytes per hashed block (about 64 tokens of English text), ...
    block_bytes: int = Field(default=256, ge=16, le=65536)
    # ... blocks hashed per request (the first 16 KiB by default), ...
    max_blocks: int = Field(default=64, ge=1, le=4096)
    # ... and blocks remembered per upstream (LRU): about what its prefix cache holds,
    # KV cache tokens x 4 / block_bytes.
    index_blocks: int = Field(default=16384, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _mode_alone(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in ROUTING_MODES:
                raise ValueError(
                    f"unknown routing {value!r}; use {' or '.join(ROUTING_MODES)}, or a mapping "
                    "with mode: and its settings"
                )
            return {"mode": value}
        return value


class GatewayConfig(_Strict):
    listen: ListenConfig = Field(default_factory=ListenConfig)
    policy: str = "vtc"
    redis: RedisConfig | None = None
    # Path to a tenants file in the server's format (relative to this file), or the
    # same content inline; None = one open tenant.
    tenants: str | dict[str, Any] | None = None
    tenant_from_user: bool = False
    upstreams: list[UpstreamConfig] = Field(min_length=1)
    models: dict[str, ModelConfig] = {}
    cost: CostConfig = Field(default_factory=CostConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    # The order of one tenant's own requests under the counter policies: `priority`
    # (lower first, ties by arrival, as the server does) or `arrival`.
    order_within_tenant: Literal["priority", "arrival"] = "priority"
    max_waiting: int = Field(default=4096, ge=1)
    # What a request without max_tokens reserves (non-streaming charge, in-flight tokens).
    default_max_tokens: int = Field(default=256, ge=1)
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    # A client's time to send a request's headers, and its longest pause in the body.
    read_timeout_s: float = Field(default=DEFAULT_READ_TIMEOUT_S, gt=0)
    # A client's time, from the end of a request's headers, to send its whole body.
    body_timeout_s: float = Field(default=DEFAULT_BODY_TIMEOUT_S, gt=0)
    # Serve /openapi.json, /docs and /redoc (open to whoever reaches the API port).
    api_docs: bool = False
    # This replica's name in Redis (default: a random one per start); letters, digits
    # and . _ : @ / + - (the Redis scripts' fields are tab- and space-separated).
    gateway_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$"
    )
    # The key of the per-tenant cache salts the gateway sends upstream (the same in
    # every replica, like the Redis namespace); without it the salts are keyed by the
    # namespace, which anyone who knows it and a tenant's name can recompute.
    cache_salt_secret: str | None = Field(default=None, min_length=16)

    # Where relative paths (tenants, tokenizers) are resolved; set by load_config.
    base_dir: Path = Field(default=Path("."), exclude=True)
    # The file it was read from, and the YAML node of inline tenants: a mistake in them
    # is reported at its own line of this file.
    source: str = Field(default="<config>", exclude=True)
    _tenants_node: Any = PrivateAttr(default=None)

    @property
    def tenants_node(self) -> Any:
        return self._tenants_node

    @field_validator("policy")
    @classmethod
    def _policy(cls, policy: str) -> str:
        name = policy.strip().lower().partition(":")[0]
        from tokenfair.core.policies.loading import is_user_spec

        if is_user_spec(policy):
            return _user_policy(policy.strip())
        if name not in SHARED_COUNTER_POLICIES and name not in LOCAL_POLICIES:
            known = ", ".join([*SHARED_COUNTER_POLICIES, *usage(LOCAL_POLICIES)])
            raise ValueError(
                f"unknown or unsupported policy {policy!r}; the gateway runs: {known}; or "
                "your own KeyedPolicy as package.module:ClassName"
            )
        if name in LOCAL_POLICIES:
            from tokenfair.core.policies import make_policy
            from tokenfair.core.policies.registry import PolicyError

            try:
                make_policy(policy)
            except PolicyError as error:
                raise ValueError(str(error)) from None
        return policy.strip().lower()

    @field_validator("upstreams")
    @classmethod
    def _unique_upstreams(cls, upstreams: list[UpstreamConfig]) -> list[UpstreamConfig]:
        """Each upstream once, by name and by URL."""
        names: set[str] = set()
        urls: dict[str, UpstreamConfig] = {}
        for index, upstream in enumerate(upstreams):
            if upstream.name is None:
                upstream.name = f"upstream-{index}"
            if upstream.name in names:
                raise _At(
                    (index, "name"), f"the name {upstream.name!r} of upstream {index} is used twice"
                )
            names.add(upstream.name)
            same = urls.setdefault(same_engine(upstream.url), upstream)
            if same is not upstream:
                raise _At(
                    (index, "url"),
                    f"{upstream.url} is upstream {same.name!r} already: one engine listed twice "
                    "would have its capacity counted twice (list it once, with all its models)",
                )
        return upstreams

    @model_validator(mode="after")
    def _no_setting_ignored(self) -> GatewayConfig:
        """Two settings of which one would be silently ignored are refused together."""
        if self.tenant_from_user and self.tenants is not None:
            raise _At(
                ("tenant_from_user",),
                "tenant_from_user and tenants exclude each other: with a tenants file the "
                "API key names the tenant and `user` is only a label; remove one",
            )
        if "order_within_tenant" in self.model_fields_set and not self.shared_counters:
            raise _At(
                ("order_within_tenant",),
                f"order_within_tenant orders a tenant's requests under the counter policies "
                f"({', '.join(SHARED_COUNTER_POLICIES)}); policy {self.policy!r} orders every "
                "request itself: remove one",
            )
        return self

    @property
    def shared_counters(self) -> bool:
        return self.policy.partition(":")[0] in SHARED_COUNTER_POLICIES

    @property
    def lift_rule(self) -> str:
        return SHARED_COUNTER_POLICIES.get(self.policy.partition(":")[0], "paper")

    def served_models(self) -> list[str]:
        models: list[str] = []
        for upstream in self.upstreams:
            models.extend(m for m in upstream.models if m not in models)
        return models


def same_engine(url: str) -> str:
    """An upstream URL (without its trailing / or /v1) as one engine has it: the host
    in lower case, the scheme's port written out; names are not resolved."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}{parts.path}"


def _user_policy(spec: str) -> str:
    """A user's policy class (`mypkg.mod:MyPolicy(...)`, or installed by name): the
    gateway orders each band by its `sort_key` alone, so it must be a KeyedPolicy."""
    from tokenfair.core.policies import make_policy
    from tokenfair.core.policies.base import KeyedPolicy
    from tokenfair.core.policies.registry import PolicyError

    try:
        policy = make_policy(spec)
    except PolicyError as error:
        raise ValueError(str(error)) from None
    if not isinstance(policy, KeyedPolicy):
        raise ValueError(
            f"policy {spec!r}: {type(policy).__name__} is not a KeyedPolicy; the gateway "
            "runs a policy of your own only if it orders by a static sort_key (it honours "
            "sort_key, accept and on_admit, nothing else)"
        )
    return spec


def parse_config(
    text: str, source: str = "<config>", base_dir: Path | None = None
) -> GatewayConfig:
    try:
        data, root = load_with_nodes(text)
    except yaml.YAMLError as error:
        raise GatewayConfigError(yaml_error(error, source)) from None
    if not isinstance(data, dict):
        raise GatewayConfigError(f"{source}: expected a mapping of settings at the top level")
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        loc = tuple(
            p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))
        )
        loc += getattr(first.get("ctx", {}).get("error"), "loc", ())
        key = ".".join(str(p) for p in loc) or "(top level)"
        line = line_of(root, loc)
        where = f"{source}:{line}" if line else source
        message = validation_message(first)
        raise GatewayConfigError(f"{where}: {key}: {message}") from None
    config.base_dir = base_dir or Path(".")
    config.source = source
    if isinstance(config.tenants, dict) and isinstance(root, yaml.MappingNode):
        config._tenants_node = next((v for k, v in root.value if k.value == "tenants"), None)
    return config


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise GatewayConfigError(f"{path}: cannot read the config file: {error.strerror}") from None
    return parse_config(text, str(path), path.resolve().parent)
