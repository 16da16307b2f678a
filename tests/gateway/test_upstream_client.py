"""The gateway's own upstream HTTP client against real local servers: the tests' fake
upstream (uvicorn) and tiny asyncio servers that answer with exact bytes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvloop

from tests.gateway.processes import Process, fake_upstream, stats
from tokenfair.gateway.upstreams.client import (
    UpstreamClient,
    UpstreamDisconnected,
    UpstreamError,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Run = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Each test on both event loops: the gateway runs on uvloop, whose transports
    differ from asyncio's."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    process = fake_upstream(tmp_path_factory.mktemp("client"), "u0", token_interval=0.005)
    try:
        yield process
    finally:
        process.stop()


def _chat(max_tokens: int, stream: bool) -> bytes:
    return orjson.dumps(
        {
            "model": "fake",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def test_content_length_response_and_keep_alive_reuse(upstream: Process, run: Run) -> None:
    async def main() -> tuple[list[int], int]:
        client = UpstreamClient(upstream.url, {"content-type": "application/json"})
        statuses = []
        for _ in range(5):
            response = await client.request("POST", "/v1/chat/completions", _chat(3, False))
            body = orjson.loads(await response.read())
            assert body["choices"][0]["message"]["content"] == "tok tok tok "
            assert response.header(b"content-length") is not None
            statuses.append(response.status)
            response.release()
        idle = client.idle_connections
        await client.close()
        return statuses, idle

    before = stats(upstream)["connections"]
    statuses, idle = run(main())
    assert statuses == [200] * 5
    assert idle == 1
    assert stats(upstream)["connections"] == before + 1  # one connection carried all five


def test_chunked_stream_arrives_incrementally(upstream: Process, run: Run) -> None:
    async def main() -> list[bytes]:
        client = UpstreamClient(upstream.url, {"content-type": "application/json"})
        response = await client.request("POST", "/v1/chat/completions", _chat(8, True))
        assert response.status == 200
        assert (response.header(b"content-type") or b"").startswith(b"text/event-stream")
        assert response.header(b"transfer-encoding") == b"chunked"
        chunks = [chunk async for chunk in response]
        response.release()
        assert client.idle_connections == 1  # read to its end: back in the pool
        await client.close()
        return chunks

    chunks = run(main())
    text = b"".join(chunks)
    assert text.count(b'"tok "') == 8 and text.rstrip().endswith(b"data: [DONE]")
    assert len(chunks) >= 8  # one piece per token (5 ms apart), not one buffered body


def test_abandoned_response_closes_its_connection(upstream: Process, run: Run) -> None:
    async def main() -> tuple[int, int]:
        client = UpstreamClient(upstream.url, {"content-type": "application/json"})
        response = await client.request("POST", "/v1/chat/completions", _chat(400, True))
        await response.__anext__()  # the first piece, then walk away
        response.release()
        idle = client.idle_connections
        await client.close()
        return idle, response.status

    aborted = stats(upstream)["aborted"]
    idle, status = run(main())
    assert status == 200 and idle == 0
    for _ in range(100):  # the upstream notices the closed connection and aborts
        if stats(upstream)["aborted"] > aborted:
            break
        time.sleep(0.05)
    assert stats(upstream)["aborted"] == aborted + 1


def test_read_until_close_body(run: Run) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst ")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"second")
        await writer.drain()
        writer.close()

    async def main() -> tuple[bytes, int]:
        server, url = await _serve(handler)
        client = UpstreamClient(url)
        response = await client.request("GET", "/x")
        body = await response.read()
        response.release()
        idle = client.idle_connections
        await client.close()
        server.close()
        return body, idle

    body, idle = run(main())
    assert body == b"first second"
    assert idle == 0  # the connection ended with the body


def test_upstream_closing_mid_stream_raises(run: Run) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            b"d\r\ndata: one\r\n\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.close()  # no terminating chunk

    async def main() -> list[bytes]:
        server, url = await _serve(handler)
        client = UpstreamClient(url)
        response = await client.request("POST", "/v1/completions", b"{}")
        received: list[bytes] = []
        try:
            with pytest.raises(UpstreamDisconnected):
                async for chunk in response:
                    received.append(chunk)
        finally:
            response.release()
            await client.close()
            server.close()
        return received

    assert run(main()) == [b"data: one\r\n\r\n"]


def test_request_carries_head_headers_and_body_in_one_piece(run: Run) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _read_request(reader))
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy")
        await writer.drain()
        writer.close()

    async def main() -> tuple[int, bytes]:
        server, url = await _serve(handler)
        client = UpstreamClient(url + "/base", {"authorization": "Bearer sk-up"})
        response = await client.request("POST", "/v1/completions", b'{"a": 1}')
        body = await response.read()
        response.release()
        await client.close()
        server.close()
        return response.status, body

    status, body = run(main())
    assert (status, body) == (503, b"busy")
    head, _, sent = seen[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /base/v1/completions HTTP/1.1"
    assert b"authorization: Bearer sk-up" in lines and b"content-length: 8" in lines
    assert any(line.startswith(b"host: 127.0.0.1:") for line in lines)
    assert sent == b'{"a": 1}'


def test_an_idle_connection_the_upstream_closed_is_not_reused(run: Run) -> None:
    connections = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()  # an upstream's keep-alive timeout, shorter than ours

    async def main() -> list[bytes]:
        server, url = await _serve(handler)
        client = UpstreamClient(url)
        bodies = []
        for _ in range(2):
            response = await client.request("GET", "/")
            bodies.append(await response.read())
            response.release()
            await asyncio.sleep(0.1)
        await client.close()
        server.close()
        return bodies

    assert run(main()) == [b"ok", b"ok"]
    assert connections[0] == 2


def test_refused_connection_raises(tmp_path: Path, run: Run) -> None:
    from tests.gateway.redis_server import free_port

    async def main() -> None:
        client = UpstreamClient(f"http://127.0.0.1:{free_port()}")
        with pytest.raises(UpstreamError):
            await client.request("GET", "/")

    run(main())


def test_a_lagging_consumer_pauses_reading(run: Run) -> None:
    """While the consumer takes nothing, the client stops reading: the upstream's bytes
    back up in its own send buffer instead of piling up in the gateway."""
    size = 32 * 1024 * 1024
    backlog: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await asyncio.sleep(0.3)
        backlog.append(writer.transport.get_write_buffer_size())
        await writer.drain()
        writer.close()

    async def main() -> int:
        server, url = await _serve(handler)
        client = UpstreamClient(url)
        response = await client.request("GET", "/")
        await asyncio.sleep(0.5)  # the consumer lags
        received = 0
        async for chunk in response:
            received += len(chunk)
        response.release()
        await client.close()
        server.close()
        return received

    assert run(main()) == size
    assert backlog[0] > size // 2  # most of the body was still waiting upstream


def test_the_pool_sends_the_upstreams_api_key(run: Run) -> None:
    from tokenfair.gateway.config import UpstreamConfig
    from tokenfair.gateway.upstreams.pool import Upstream

    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()

    async def main() -> None:
        server, url = await _serve(handler)
        config = UpstreamConfig(url=url + "/v1", models=["m"], max_concurrent=1, api_key="sk-up")
        upstream = Upstream(config)
        upstream.open()
        response = await upstream.client.request("POST", "/v1/completions", b"{}")
        assert await response.read() == b"{}"
        response.release()
        await upstream.close()
        server.close()

    run(main())
    lines = seen[0].split(b"\r\n")
    assert lines[0] == b"POST /v1/completions HTTP/1.1"
    assert b"authorization: Bearer sk-up" in lines
    assert b"content-type: application/json" in lines
    assert b"accept-encoding: identity" in lines
