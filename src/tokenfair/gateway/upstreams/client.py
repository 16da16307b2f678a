"""A lean HTTP/1.1 client for the gateway's hot path (the proxied completion requests),
and the gateway's only one: its health checks, metrics scrapes and `--check` use it too.

Why it exists: a general-purpose client (aiohttp, httpx) spends more of the gateway's
CPU per request than everything else the gateway does (under load, ~30% of the
gateway's CPU sat in aiohttp's request machinery, and it added ~0.45 ms per request at
idle). The gateway needs very little of what such a client does: one known upstream,
a request whose bytes are built up front (method, path, fixed headers, the API key,
the JSON body), sent in one write on a keep-alive connection, and a response whose
status and headers are parsed by httptools (llhttp, in C) and whose body is handed on
chunk by chunk as it arrives. No cookies, redirects, decompression or proxies.

Contract with the proxy:

- `UpstreamClient.request` returns once the status and headers are in; the body is
  then read with `UpstreamResponse.read()` or `async for chunk in response`
  (content-length, chunked, or read until close; reading pauses while more than
  `HIGH_WATER` bytes wait for the consumer).
- `UpstreamResponse.release()` puts the connection back into the pool only when the
  response was read to its end and both sides keep the connection alive; otherwise it
  closes the connection, which is how an abandoned request is aborted upstream.
- Every failure (refused, reset, end of stream mid-response, a malformed response) is
  an `UpstreamError` (an `OSError`); a connect that takes too long is a `TimeoutError`.
- `UpstreamClient.get` (the probes, off the hot path) reads a whole answer within a
  total timeout; `failure_name` names why it failed.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

# Bytes buffered for the consumer before reading from the upstream pauses; it resumes
# when the consumer takes them (each read takes everything buffered).
HIGH_WATER = 256 * 1024
# What a probe sends beyond the host (reach.py's, and the pool's health checks and
# scrapes): no API key and no body, as health and metrics endpoints are open.
PROBE_HEADERS = {"accept-encoding": "identity"}


class UpstreamError(OSError):
    """The upstream could not be reached, or broke off or garbled its response."""


class UpstreamDisconnected(UpstreamError):
    """The connection ended before the response did."""


class UpstreamProtocolError(UpstreamError):
    """The upstream's bytes are not a valid HTTP/1.1 response."""


def failure_name(error: BaseException) -> str:
    """What went wrong, by name: a failed connect's own error (ConnectionRefusedError,
    gaierror), else the error's class (UpstreamDisconnected, TimeoutError)."""
    cause = error.__cause__ if isinstance(error, UpstreamError) else None
    return type(cause or error).__name__


class _Connection(asyncio.Protocol):
    """One TCP connection, carrying one request/response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.reused = False  # carried a response before this one
        self.answered = False  # bytes came back for the current request
        self.response: UpstreamResponse | None = None

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.answered = True
        if self.response is None or self.response.complete:
            self.close()  # bytes nobody asked for: the connection is unusable
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.response._fail(UpstreamProtocolError(f"invalid response from upstream: {error}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost does the bookkeeping

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if response.headers_done and response.until_close:
                response._finish()  # no length and no chunks: the end of stream ends the body
            else:
                response._fail(UpstreamDisconnected("upstream closed the connection mid-response"))

    def pause_writing(self) -> None:  # a request is one small write
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks ---
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        response.status = self.parser.get_status_code()
        response._headers_complete(self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        self.response.keep_alive = self.response.keep_alive and self.parser.should_keep_alive()
        self.response._finish()

    # ---
    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """An upstream's answer: status and headers at once, the body as it arrives."""

    __slots__ = (
        "_buffer",
        "_buffered",
        "_conn",
        "_error",
        "_headers_waiter",
        "_paused",
        "_pool",
        "_released",
        "_waiter",
        "complete",
        "headers_done",
        "keep_alive",
        "raw_headers",
        "status",
        "until_close",
    )

    def __init__(self, conn: _Connection, pool: UpstreamClient) -> None:
        self._conn = conn
        self._pool = pool
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self._buffer: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._error: BaseException | None = None
        self._released = False
        loop = asyncio.get_running_loop()
        self._headers_waiter: asyncio.Future[None] = loop.create_future()
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lower case), if present."""
        for key, value in self.raw_headers:
            if key.lower() == name:
                return value
        return None

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; UpstreamError once it grows past `limit` bytes."""
        chunks, size = [], 0
        async for chunk in self:
            size += len(chunk)
            if limit is not None and size > limit:
                raise UpstreamError(f"the answer is larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        """The body's bytes received since the last call; raises at the end of the body."""
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self.complete:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._buffer.popleft() if len(self._buffer) == 1 else b"".join(self._buffer)
        self._buffer.clear()
        self._buffered = 0
        if self._paused and not self._conn.closed and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()
        return chunk

    def release(self) -> None:
        """Back to the pool if read to its end; otherwise close (aborting it upstream)."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        conn.response = None
        if self.complete and self._error is None and self.keep_alive and not self._buffer:
            self._pool._put_back(conn)
        else:
            conn.close()

    # --- fed by the connection ---
    def _headers_complete(self, keep_alive: bool) -> None:
        self.headers_done = True
        self.keep_alive = keep_alive
        names = {key.lower() for key, _ in self.raw_headers}
        no_body = self.status in (204, 304) or 100 <= self.status < 200
        self.until_close = (
            not no_body and b"content-length" not in names and b"transfer-encoding" not in names
        )
        if not self._headers_waiter.done():
            self._headers_waiter.set_result(None)

    def _feed(self, body: bytes) -> None:
        self._buffer.append(bytes(body))
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if not self._headers_waiter.done():
            self._headers_waiter.set_exception(error)
            self._headers_waiter.exception()  # retrieved here: the caller may be gone
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class UpstreamClient:
    """A keep-alive connection pool to one upstream, with pre-built request heads."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        connect_timeout_s: float = 5.0,
        keepalive_s: float = 4.0,
        max_idle: int = 128,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.base_path = parts.path.rstrip("/")
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = self.host if default_port else f"{self.host}:{self.port}"
        if ":" in self.host:  # an IPv6 literal
            host = f"[{self.host}]" if default_port else f"[{self.host}]:{self.port}"
        fixed = {"host": host, **(headers or {})}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._heads: dict[tuple[str, str], bytes] = {}
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle
        self._idle: list[_Connection] = []  # most recently used last
        self._closed = False

    def _head(self, method: str, path: str) -> bytes:
        """The request line and fixed headers for (method, path), built once."""
        head = self._heads.get((method, path))
        if head is None:
            line = f"{method} {self.base_path}{path} HTTP/1.1\r\n".encode("latin-1")
            head = self._heads[(method, path)] = line + self._fixed
        return head

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse:
        """Send one request; return when the response's status and headers are in.

        A reused keep-alive connection that the upstream closed just before it saw the
        request (nothing came back) is replaced by a fresh one, once.
        """
        extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items())
        data = b"".join(
            (self._head(method, path), extra, b"content-length: %d\r\n\r\n" % len(body), body)
        )
        while True:
            conn = self._take_idle() or await self._connect()
            try:
                return await self._exchange(conn, data)
            except UpstreamDisconnected:
                if not conn.reused or conn.answered:
                    raise

    async def get(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        """GET `path`: the status and the whole body, within `timeout_s` in all (connect
        included; past it a `TimeoutError`). The connection is kept for the next one."""
        async with asyncio.timeout(timeout_s):
            response = await self.request("GET", path)
            try:
                return response.status, await response.read()
            finally:
                response.release()

    async def _exchange(self, conn: _Connection, data: bytes) -> UpstreamResponse:
        response = UpstreamResponse(conn, self)
        conn.response = response
        conn.answered = False
        assert conn.transport is not None
        try:
            conn.transport.write(data)
            await response._headers_waiter
        except BaseException:  # cancelled, cut off or garbled: this connection is done
            conn.response = None
            conn.close()
            raise
        return response

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                conn.reused = True
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        if self._closed:
            raise UpstreamError("the upstream client is closed")
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            try:
                _, conn = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=self.ssl
                )
            except UpstreamError:
                raise
            except OSError as error:  # refused, unreachable, name not found
                raise UpstreamError(
                    f"cannot connect to {self.host}:{self.port}: {error}"
                ) from error
        return conn

    def _put_back(self, conn: _Connection) -> None:
        if self._closed or conn.closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        if len(self._idle) > self.max_idle:
            self._idle.pop(0).close()  # the longest idle one goes

    @property
    def idle_connections(self) -> int:
        return sum(1 for conn in self._idle if not conn.closed)

    async def close(self) -> None:
        """Close the idle connections; responses in flight close on release."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
        await asyncio.sleep(0)  # let the transports finish closing
