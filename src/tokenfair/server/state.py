"""Everything one server instance holds: model, engine thread, tenants, limits, metrics."""

from __future__ import annotations

import functools
import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from tokenfair.core.share_tree import ShareTree, group_id
from tokenfair.edge.defaults import DEFAULT_MAX_BODY_BYTES
from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.limits import Limits
from tokenfair.edge.tenants import TenantsFileError, load_tenants
from tokenfair.engine.engine_client import EngineClient
from tokenfair.server.metrics import ServerMetrics, Snapshot
from tokenfair.server.model import ServedModel

log = logging.getLogger(__name__)

# What a request gets without max_tokens (also the sim: default output length).
DEFAULT_MAX_TOKENS = 256


@dataclass(slots=True)
class ServerConfig:
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_waiting_total: int = 4096  # across tenants, then 503
    request_timeout_s: float | None = 600.0  # per request; tenants may override
    tenants_path: Path | None = None
    tenant_from_user: bool = False
    # The port serving /metrics and /health only, without a key (edge/operator_port.py).
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")


@dataclass(slots=True)
class ServerState:
    model: ServedModel
    engine: EngineClient
    tenants: TenantDirectory
    config: ServerConfig
    metrics: ServerMetrics
    limits: Limits
    created: int = field(default_factory=lambda: int(time.time()))
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _id_prefix: str = field(default_factory=lambda: secrets.token_hex(4))

    def new_request_id(self, kind: str) -> str:
        return f"{kind}-{self._id_prefix}{next(self._ids):x}"

    async def snapshot(self) -> Snapshot:
        return await self.engine.call(Snapshot.take)

    async def reload_tenants(self) -> str | None:
        """Re-read the tenants file; None on success, else the error (the old file stays)."""
        path = self.config.tenants_path
        if path is None:
            return "no tenants file was given (--tenants)"
        try:
            loaded = load_tenants(path)
        except TenantsFileError as error:
            log.error("tenants file not reloaded, the previous one stays in force: %s", error)
            return str(error)
        try:
            self.tenants.replace(loaded)
        except TenantsFileError as error:
            log.error("tenants file not reloaded, the previous one stays in force: %s", error)
            return str(error)
        weights = self.tenants.weights()
        tree = self.tenants.tree
        await self.engine.call(functools.partial(_set_weights, weights=weights, tree=tree))
        self.metrics.tenants(t.name for t in loaded.tenants)
        self.metrics.tree = tree
        log.info("tenants file reloaded: %d tenants", len(loaded.tenants))
        return None

    async def set_weight(self, tenant: str, weight: float) -> None:
        """Change a tenant's weight; the scheduler's next decision uses it."""
        self.tenants.set_weight(tenant, weight)
        await self.engine.call(functools.partial(_set_weights, weights={tenant: weight}))

    async def set_group_weight(self, path: str, weight: float) -> None:
        """Change a group's weight; the scheduler's next decision uses it."""
        self.tenants.set_group_weight(path, weight)
        weights = {group_id(path): weight}
        await self.engine.call(functools.partial(_set_weights, weights=weights))


def _set_weights(engine: object, weights: dict[str, float], tree: ShareTree | None = None) -> None:
    """Where the engine steps: new weights (tenants, and groups as `@path`) and, after a
    reload, the tree with its new tenants and groups (the directory refused any move)."""
    policy = engine.scheduler.policy  # type: ignore[attr-defined]
    current = getattr(policy, "weights", None)
    if isinstance(current, dict):
        current.update(weights)
    if tree is not None and isinstance(getattr(policy, "tree", None), ShareTree):
        policy.tree = tree
