"""`tokenfair gateway`: fair admission in front of OpenAI-compatible servers."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tokenfair.commands.common import ShutdownTimeout

console = Console(stderr=True)


def gateway(
    config: Annotated[Path, typer.Option("--config", help="Gateway config file (YAML).")] = Path(
        "gateway.yaml"
    ),
    check: Annotated[bool, typer.Option("--check", help="Validate the config and exit.")] = False,
    host: Annotated[
        str | None, typer.Option(help="Listen address (overrides listen.host).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (overrides listen.port).")] = None,
    log_level: Annotated[
        str, typer.Option(help="Log level: debug, info, warning, error.")
    ] = "warning",
    shutdown_timeout: ShutdownTimeout = 5,
) -> None:
    """Fair-share admission gateway in front of vLLM, SGLang or tokenfair servers."""
    from tokenfair.gateway.config import GatewayConfigError, load_config

    try:
        settings = load_config(config)
        if host is not None:
            settings.listen.host = host
        if port is not None:
            settings.listen.port = port
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
            return
        app = create_app(settings)
    except GatewayConfigError as error:
        names_a_file = re.match(r"[^\s:]+\.(ya?ml|json):", str(error))
        where = "" if names_a_file else f"{config}: "  # every message names its file
        console.print(f"[red]error:[/red] {where}{error}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=2) from None
    import uvicorn

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        app,
        host=settings.listen.host,
        port=settings.listen.port,
        log_level=log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
        proxy_headers=False,  # the client address is never used; skip the middleware
        timeout_graceful_shutdown=shutdown_timeout,
    )
