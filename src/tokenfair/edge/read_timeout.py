"""uvicorn's httptools protocol with the read timeouts uvicorn lacks.

uvicorn closes a keep-alive connection left idle between requests, but waits for ever
for a request that has begun: a client that sends half its headers, or announces a
body and never sends it, holds a connection (and, after the headers, a handler) as long
as it likes, and a few hundred such clients exhaust the server (slowloris). As nginx's
`client_header_timeout` and `client_body_timeout` do:

- a request's headers must all arrive within `read_timeout_s` of its first byte, and
  a new connection's first byte within `read_timeout_s` of its opening: sending the
  headers a byte at a time does not buy more time;
- its body may pause for at most `read_timeout_s` between two pieces, and must have
  arrived whole within `body_timeout_s` of the end of the headers: a client trickling
  a byte at a time, never pausing long, does not hold the connection for ever either.

Past any of them, the connection is closed: the handler, if one waits for the body, sees
the client gone. One timer per connection, re-armed only when it fires, so a request
costs a clock read or two, not a timer of its own.
"""

from __future__ import annotations

import asyncio
import math
from typing import TypeVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tokenfair.edge.defaults import DEFAULT_BODY_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S


class ReadTimeoutProtocol(HttpToolsProtocol):
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    _timer: asyncio.TimerHandle | None = None
    _reading = False  # a request has begun and not all of it has arrived
    _since = 0.0  # loop time the current deadline counts from
    _body_by = math.inf  # loop time by which the current request's body must be in

    def _begin(self) -> None:
        self._reading = True
        self._since = self.loop.time()
        self._body_by = math.inf
        if self._timer is None:
            self._timer = self.loop.call_later(self.read_timeout_s, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self._reading or self.transport.is_closing():
            return
        left = min(self._since + self.read_timeout_s, self._body_by) - self.loop.time()
        if left <= 0:
            self.transport.close()  # too slow: as uvicorn's own keep-alive timeout does
        else:
            self._timer = self.loop.call_later(left, self._check)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._begin()  # a connection that never sends a byte is a slow request too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begin()

    def on_headers_complete(self) -> None:
        now = self._since = self.loop.time()  # now the body, read by read ...
        self._body_by = now + self.body_timeout_s  # ... and whole by this time
        if self.body_timeout_s < self.read_timeout_s and self._timer is not None:
            self._timer.cancel()  # it would fire after the body's deadline
            self._timer = self.loop.call_later(self.body_timeout_s, self._check)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._since = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._reading = False
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)


P = TypeVar("P", bound=ReadTimeoutProtocol)


def read_timeout_protocol(
    read_timeout_s: float,
    base: type[P] = ReadTimeoutProtocol,  # type: ignore[assignment]
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> type[P]:
    """The protocol class (`base` or a subclass of it) with these timeouts."""
    return type(
        base.__name__,
        (base,),
        {"read_timeout_s": read_timeout_s, "body_timeout_s": body_timeout_s},
    )
