"""The sockets `tokenfair serve` and `tokenfair gateway` listen on: the API port, and
the metrics port when there is one (edge/operator_port.py), both served by one uvicorn
server: the application tells them apart by the port a request came in on."""

from __future__ import annotations

import socket
from typing import Any

import uvicorn


def bind(
    app: Any, host: str, port: int, metrics_host: str | None, metrics_port: int | None
) -> list[socket.socket]:
    """Bound sockets (uvicorn's own binding: SO_REUSEADDR, its log line per socket);
    a port that cannot be bound ends the process with uvicorn's message."""
    sockets = [uvicorn.Config(app, host=host, port=port).bind_socket()]
    if metrics_port is not None:
        where = metrics_host or host
        sockets.append(uvicorn.Config(app, host=where, port=metrics_port).bind_socket())
    return sockets
