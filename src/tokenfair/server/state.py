"""Everything one server instance holds: model, engine thread, tenants, limits, metrics."""

from __future__ import annotations

import functools
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tokenfair.core.share_tree import ShareTree, group_id
from tokenfair.edge.defaults import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_STREAM_BUFFER_BYTES
from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.errors import APIError, shutting_down
from tokenfair.edge.limits import Limits
from tokenfair.edge.tenants import TenantsFileError, load_tenants
from tokenfair.engine.engine import Engine
from tokenfair.engine.engine_client import EngineClient
from tokenfair.engine.stats import EngineStats
from tokenfair.server.backlog import MIN_STREAM_BUFFER_BYTES
from tokenfair.server.metrics import ServerMetrics
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
    # Events a stream may hold for a client reading too slowly before it is cut
    # (server/backlog.py).
    max_stream_buffer_bytes: int = DEFAULT_MAX_STREAM_BUFFER_BYTES
    # Serve /openapi.json, /docs and /redoc (open to whoever reaches the API port).
    api_docs: bool = False

    def __post_init__(self) -> None:
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.max_stream_buffer_bytes < MIN_STREAM_BUFFER_BYTES:
            raise ValueError(
                f"max_stream_buffer_bytes must be >= {MIN_STREAM_BUFFER_BYTES}, "
                f"got {self.max_stream_buffer_bytes}"
            )


class Answer(Protocol):
    """A request being answered: its choices (server/choices.py), one or several."""

    @property
    def streaming(self) -> bool: ...

    def cut(self, error: APIError) -> None:
        """End it now with `error`: its engine requests are aborted, and what was
        already generated is answered with the error."""


@dataclass(slots=True)
class ServerState:
    model: ServedModel
    engine: EngineClient
    tenants: TenantDirectory
    config: ServerConfig
    metrics: ServerMetrics
    limits: Limits
    created: int = field(default_factory=lambda: int(time.time()))
    # The requests being answered, from their admission to their answer's end.
    answering: set[Answer] = field(default_factory=set)

    def new_request_id(self, kind: str) -> str:
        return new_response_id(kind)

    def cut_at_shutdown(self) -> None:
        """The shutdown's grace period is over: cut every request still being answered.
        A stream ends with what it was sent, a `shutting_down` error event, its usage
        (when asked) and `[DONE]`; a request not yet answered gets a 503. They end
        themselves, so the server's shutdown then finds nothing left to cancel."""
        answers = list(self.answering)
        streams = sum(answer.streaming for answer in answers)
        for answer in answers:
            answer.cut(shutting_down())
        if answers:
            log.info(
                "shutting down: %d streams and %d other requests still running after "
                "the grace period were cut",
                streams,
                len(answers) - streams,
            )

    async def snapshot(self) -> EngineStats:
        return await self.engine.call(Engine.stats)

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


def new_response_id(kind: str) -> str:
    """A response's `id`: random, so that a tenant cannot count from the ids of two of
    its own requests how many other tenants' came between them (a counter would say
    so, and a gateway relays the id as it is)."""
    return f"{kind}-{secrets.token_hex(12)}"


def _set_weights(engine: Engine, weights: dict[str, float], tree: ShareTree | None = None) -> None:
    """Where the engine steps: new weights (tenants, and groups as `@path`) and, after a
    reload, the tree with its new tenants and groups (the directory refused any move)."""
    engine.reweigh(weights, tree)
