"""The sockets `tokenfair serve` and `tokenfair gateway` listen on: the API port, and
the metrics port when there is one (edge/operator_port.py), both served by one uvicorn
server: the application tells them apart by the port a request came in on. And that
server, which sets its start-up heap aside from the garbage collector."""

from __future__ import annotations

import gc
import socket
from typing import Any

import uvicorn


def bind(
    app: Any, host: str, port: int, metrics_host: str | None, metrics_port: int | None
) -> list[socket.socket]:
    """Bound sockets (uvicorn's own binding: SO_REUSEADDR, its log line per socket);
    a port that cannot be bound ends the process with uvicorn's message.

    The Configs made here only bind: logging stays as the server's own Config set it.
    (A Config with uvicorn's defaults would install its access log again, one line
    written per request, which costs the gateway a third of its short requests/s.)"""

    def bound(where: str, number: int) -> socket.socket:
        only_binds = uvicorn.Config(app, host=where, port=number, log_config=None, access_log=False)
        return only_binds.bind_socket()

    sockets = [bound(host, port)]
    if metrics_port is not None:
        sockets.append(bound(metrics_host or host, metrics_port))
    return sockets


# Allocations between two collections of the youngest generation (Python's default is
# 700). A request allocates a few hundred tracked objects, nearly all freed by reference
# counting when it ends: collecting every 700 walks the same in-flight requests' objects
# over and over. 20,000 holds a few megabytes at most, and gave the gateway 5% more
# short requests/s.
YOUNG_COLLECTION_EVERY = 20_000


class Server(uvicorn.Server):
    """uvicorn's server, which moves every object alive once the application has
    started (modules, tokenizers, the model, tables) out of the garbage collector's
    view (gc.freeze), and collects the youngest generation less often. Left in, the
    start-up heap is walked by each full collection: some 25 ms every few thousand
    requests on the gateway, a pause every request then in flight waits out (its p99
    latency) and some 7% of its requests/s."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_COLLECTION_EVERY)
