"""`tokenfair gateway`: fair admission in front of OpenAI-compatible servers."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from tokenfair.commands.common import LOG_FORMAT, ShutdownTimeout, require_extra

if TYPE_CHECKING:
    from tokenfair.gateway.config import GatewayConfig

console = Console(stderr=True)


def gateway(
    config: Annotated[Path, typer.Option("--config", help="Gateway config file (YAML).")] = Path(
        "gateway.yaml"
    ),
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Validate the config, ask each upstream and the Redis once, and exit: 0 all "
            "answer, 1 something does not, 2 the config is wrong.",
        ),
    ] = False,
    host: Annotated[
        str | None, typer.Option(help="Listen address (overrides listen.host).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (overrides listen.port).")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Port of /health and /metrics (overrides listen.metrics_port): a second "
            "replica on the same machine, from the same config file.",
            min=1,
            max=65535,
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="Log level: debug, info, warning, error.")
    ] = "info",
    shutdown_timeout: ShutdownTimeout = 5,
) -> None:
    """Fair-share admission gateway in front of vLLM, SGLang or tokenfair servers."""
    require_extra("tokenfair gateway", "server")
    from tokenfair.gateway.config import GatewayConfigError, load_config

    try:
        settings = load_config(config)
        if settings.redis is not None:
            require_extra(f"tokenfair gateway with redis in {config}", "redis")
        if host is not None:
            settings.listen.host = host
        if port is not None:
            settings.listen.port = port
        if metrics_port is not None:
            settings.listen.metrics_port = metrics_port
        if settings.listen.metrics_port == settings.listen.port:
            raise GatewayConfigError(
                f"--metrics-port and --port are both {settings.listen.port}: give each its own"
            )
        from tokenfair.gateway.app import build_directory, create_app, token_counters

        directory = build_directory(settings)
        if check:
            token_counters(settings)  # a tokenizer that cannot load fails the start too
            where = f"Redis {settings.redis.url}" if settings.redis else "in-memory counters"
            console.print(
                f"{config}: ok — policy {settings.policy}, routing {settings.routing.mode}, "
                f"{len(settings.upstreams)} upstream(s), "
                f"models {', '.join(settings.served_models())}, {len(directory.tenants)} tenant(s), {where}",
                soft_wrap=True,
                highlight=False,
            )
            from tokenfair.gateway.transport.upstream_tenant import isolation_warning

            warning = isolation_warning(settings.upstreams, directory)
            if warning is not None:
                console.print(f"warning: {warning}", soft_wrap=True, highlight=False)
            _reach(settings)
            return
        app = create_app(settings)
    except GatewayConfigError as error:
        names_a_file = re.match(r"[^\s:]+\.(ya?ml|json):", str(error))
        where = "" if names_a_file else f"{config}: "  # every message names its file
        console.print(f"[red]error:[/red] {where}{error}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=2) from None
    import uvicorn

    from tokenfair.commands.listeners import GracefulServer, bind, serve
    from tokenfair.edge.read_timeout import read_timeout_protocol

    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    listen = settings.listen
    uv_config = uvicorn.Config(
        app,
        host=listen.host,
        port=listen.port,
        log_level=log_level,
        # uvicorn's lines in the root logger's format (timestamps), not its own.
        log_config=None,
        access_log=False,
        loop="uvloop",
        http=read_timeout_protocol(settings.read_timeout_s, body_timeout_s=settings.body_timeout_s),
        proxy_headers=False,  # the client address is never used; skip the middleware
        timeout_graceful_shutdown=shutdown_timeout,
    )
    server = GracefulServer(uv_config, cut=app.proxy.cut_at_shutdown)
    sockets = bind(app, listen.host, listen.port, listen.metrics_host, listen.metrics_port)
    import uvloop

    uvloop.run(serve(server, sockets))


def _reach(settings: GatewayConfig) -> None:
    """--check: ask every upstream and the Redis once; exit 1 if one does not answer."""
    import asyncio

    from tokenfair.gateway.reach import probe

    reached = asyncio.run(probe(settings))
    for reach in reached:
        mark = "[green]ok[/green]" if reach.ok else "[red]not ok[/red]"
        console.print(f"{mark} {reach.line()}", soft_wrap=True, highlight=False)
    if not all(reach.ok for reach in reached):
        raise typer.Exit(code=1)
