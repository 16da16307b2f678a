"""The sockets `tokenfair serve` and `tokenfair gateway` listen on: the API port, and
the metrics port when there is one (edge/operator_port.py), each served by a uvicorn
server of its own over one application, which tells them apart by the port a request
came in on; the metrics port's server stops once the API's has drained. And the API's
server, which sets its start-up heap aside from the garbage collector and ends what
still runs at the end of its shutdown's grace period itself."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


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


# After the cut at the end of the grace period: the time the clients get to read their
# answers' last events before their connections are closed, and then the margin before
# uvicorn's own timeout, a backstop that should find nothing left.
FLUSH_AFTER_CUT_S = 1
BACKSTOP_AFTER_FLUSH_S = 1


class GracefulServer(Server):
    """A server whose shutdown ends the requests still running after the grace period
    (`timeout_graceful_shutdown`) itself, through `cut`: each then answers as it should
    (a stream its last events, a waiting request its 503) and the shutdown is an
    orderly one. Left to uvicorn, their tasks would be cancelled at its timeout, with
    an ERROR in the log for what is an ordinary stop of a server with long streams.
    uvicorn's timeout moves later, to be the backstop for a request that did not end."""

    def __init__(self, config: uvicorn.Config, cut: Callable[[], None]) -> None:
        super().__init__(config)
        self.cut = cut
        self.grace_s = config.timeout_graceful_shutdown
        if self.grace_s is not None:
            config.timeout_graceful_shutdown = (
                self.grace_s + FLUSH_AFTER_CUT_S + BACKSTOP_AFTER_FLUSH_S
            )

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        ending = None if self.grace_s is None else asyncio.ensure_future(self._end_late())
        try:
            await super().shutdown(sockets)
        finally:
            if ending is not None:
                ending.cancel()

    async def _end_late(self) -> None:
        assert self.grace_s is not None
        await asyncio.sleep(self.grace_s)
        self.cut()
        await asyncio.sleep(FLUSH_AFTER_CUT_S)
        # Connections still open now hold answers their clients have not read (a client
        # that stopped reading): waiting for them would end in uvicorn's timeout.
        unread = list(self.server_state.connections)
        for connection in unread:
            connection.transport.abort()
        if unread:
            log.warning(
                "shutting down: closed %d connections whose clients had not read their "
                "answers' ends",
                len(unread),
            )


async def serve(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Serve the API socket with `server`, and the metrics socket (the second, when
    there is one) with a server of its own that stops only once `server` has drained:
    a scrape during the drain still answers, with what the drain serves. (One server
    for both would close the metrics port at the signal.)"""
    if len(sockets) < 2:
        await server.serve(sockets)
        return
    api, metrics = sockets
    config = server.config
    pages = Server(
        uvicorn.Config(
            config.app,
            lifespan="off",  # the application starts and stops with the API's server
            log_config=None,
            access_log=False,
            log_level=config.log_level,
            http=config.http,
            proxy_headers=False,
        )
    )
    pages_done = asyncio.ensure_future(pages._serve([metrics]))  # no signal handlers
    try:
        await server.serve([api])
    finally:
        pages.should_exit = True
        await pages_done
