"""What `tokenfair serve` does once its app is built: listen (the API port, and the
metrics port when given), reload the tenants file on SIGHUP, and stop gracefully."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenfair.edge.defaults import DEFAULT_BODY_TIMEOUT_S

if TYPE_CHECKING:
    from tokenfair.edge.directory import TenantDirectory
    from tokenfair.server.intake import Intake


@dataclass(frozen=True, slots=True)
class Listen:
    """Where the server listens, and how long it waits on clients and at shutdown."""

    host: str
    port: int
    metrics_host: str | None  # None: `host`
    metrics_port: int | None  # None: /metrics on `port` only
    read_timeout_s: float
    body_timeout_s: float
    shutdown_timeout_s: int
    log_level: str


def http_protocol(
    intake: Intake, read_timeout_s: float, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
) -> str | type:
    """httptools with the chunk writer (see server/chunk_write.py) and read timeouts
    (edge/read_timeout.py), counting arrivals in `intake`, when installed."""
    if importlib.util.find_spec("httptools") is None:
        return "h11"
    from tokenfair.edge.read_timeout import read_timeout_protocol
    from tokenfair.server.chunk_write import chunk_write_protocol

    return read_timeout_protocol(
        read_timeout_s, chunk_write_protocol(intake, read_timeout_s), body_timeout_s
    )


def summary(
    name: str,
    model: str,
    policy: str,
    arrangement: str,
    kv_tokens: int,
    directory: TenantDirectory,
    tenants: Path | None,
    host: str,
    port: int,
    metrics_port: int | None,
    api_docs: bool,
) -> str:
    """The start-up line: what is served, how, to whom and where."""
    served = model if name == model else f"{model} as {name!r}"
    if tenants is not None:
        count = len(directory.tenants)
        admin = "an admin key" if directory.admin_enabled else "no admin key"
        who = f"{count} tenant{'s' if count != 1 else ''} from {tenants} ({admin})"
    elif directory.tenant_from_user:
        who = "a tenant per request's user field"
    else:
        who = "one open tenant"
    if metrics_port is not None:
        metrics = f"; metrics on port {metrics_port}"
    elif tenants is None or directory.admin_enabled:
        metrics = "; metrics on the API port" + (" (admin key)" if tenants is not None else "")
    else:
        metrics = ""
    return (
        f"tokenfair serve: model {served}, policy {policy}, engine {arrangement}, KV pool "
        f"{kv_tokens:,} tokens, {who}; on http://{host}:{port}{metrics}"
        + ("; API docs on /docs" if api_docs else "")
    )


def run_server(app: Any, intake: Intake, listen: Listen, reload_on_hangup: bool) -> None:
    """Serve `app` until stopped (SIGHUP reloads the tenants file when
    `reload_on_hangup`)."""
    import uvicorn

    from tokenfair.commands.listeners import GracefulServer, bind, serve
    from tokenfair.server.routes import FastPath

    has = importlib.util.find_spec
    uv_config = uvicorn.Config(
        FastPath(app),
        host=listen.host,
        port=listen.port,
        loop="uvloop" if has("uvloop") else "asyncio",
        http=http_protocol(intake, listen.read_timeout_s, listen.body_timeout_s),
        log_level=listen.log_level.lower(),
        # uvicorn's lines in the root logger's format (timestamps), not its own.
        log_config=None,
        access_log=False,
        # No client addresses are read (tenants come from API keys, or from the trusted
        # tenant header behind a proxy): rewriting them from X-Forwarded-For per request
        # would cost time and change nothing.
        proxy_headers=False,
        timeout_graceful_shutdown=listen.shutdown_timeout_s,
    )
    server = GracefulServer(uv_config, cut=app.state.server.cut_at_shutdown)
    sockets = bind(
        uv_config.app, listen.host, listen.port, listen.metrics_host, listen.metrics_port
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        state = app.state.server

        reloads: set[asyncio.Task[str | None]] = set()

        def on_hangup() -> None:
            task = loop.create_task(state.reload_tenants())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        if reload_on_hangup:
            loop.add_signal_handler(signal.SIGHUP, on_hangup)
        await serve(server, sockets)

    if has("uvloop"):
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
