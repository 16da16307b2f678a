"""Streaming to clients that read slowly, and without the server's chunk writer.

`tokenfair serve` writes tokens from the engine's step callback while a client keeps
up; once the client's socket is full they wait in the server and go out through the
response's task as the client reads. Under another ASGI server (no chunk writer) the
task writes every token. Either way the client gets every token and the end. What
waits for one stream is bounded (`--max-stream-buffer-bytes`): past it the stream is
cut, its generation stopped, and the client finds an error event after what it got.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httptools
import httpx
import pytest

from tests.server.conftest import KEYS, Server, free_port, launch, tenants_data

TOKENS = 40_000  # ~5 MB of events: more than the kernel buffers a stuck client's socket
BOUND = 256 << 10  # the bounded server's --max-stream-buffer-bytes
SUCCESS = "tokenfair:request_success_total"
CUT = "tokenfair:stream_backpressure_total"  # streams cut for their backlog


def long_streams_allowed(tokens: int) -> dict[str, object]:
    """The test tenants, team-a allowed `tokens` per request."""
    tenants = tenants_data()
    for tenant in tenants["tenants"]:  # type: ignore[union-attr]
        if tenant["name"] == "team-a":
            tenant["max_tokens_per_request"] = tokens
    return tenants


@pytest.fixture(scope="module")
def zero_server(server_dir) -> Iterator[Server]:
    """sim:zero: steps cost nothing, so a stream outruns any reader. Its streams may
    hold more than a whole answer: here slow clients are served to the end."""
    server = launch(
        server_dir, "--model", "sim:zero", "--kv-tokens", str(2 * TOKENS),
        "--max-stream-buffer-bytes", str(64 << 20),
        tenants=long_streams_allowed(2 * TOKENS),
    )  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bounded_server(server_dir) -> Iterator[Server]:
    """sim:zero with streams bounded at BOUND bytes."""
    server = launch(
        server_dir, "--model", "sim:zero", "--kv-tokens", str(4 * TOKENS),
        "--max-stream-buffer-bytes", str(BOUND),
        tenants=long_streams_allowed(4 * TOKENS),
    )  # fmt: skip
    yield server
    server.stop()


def events_of(body: bytes) -> list[dict]:
    events = body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], events[-3:]
    return [json.loads(event.removeprefix("data: ")) for event in events[:-2]]


def stream_body(model: str, tokens: int, n: int = 1) -> dict:
    return {
        "model": model,
        "prompt": "read me slowly",
        "max_tokens": tokens,
        "n": n,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class Response:
    """httptools callbacks: the body of one response."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.complete = False

    def on_body(self, chunk: bytes) -> None:
        self.parts.append(chunk)

    def on_message_complete(self) -> None:
        self.complete = True


def stuck_client(server: Server, body: dict, tenant: str = "team-a") -> socket.socket:
    """A socket with a tiny receive buffer that has sent a request and reads nothing."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEYS[tenant]}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def wait_for_metric(server: Server, name: str, before: float, **labels: str) -> None:
    deadline = time.monotonic() + 60
    while server.metric(name, **labels) == before:
        assert time.monotonic() < deadline, f"{name} {labels} stayed at {before}"
        time.sleep(0.05)


def read_all(sock: socket.socket) -> bytes:
    """The rest of the response on `sock`, read as fast as it comes: its body."""
    response = Response()
    parser = httptools.HttpResponseParser(response)
    sock.settimeout(60)
    while not response.complete:
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed the connection before the end"
        parser.feed_data(chunk)
    sock.close()
    assert parser.get_status_code() == 200
    return b"".join(response.parts)


def read_slowly(server: Server, body: dict, tenant: str = "team-a") -> bytes:
    """Read nothing until the engine has generated the whole stream (all of it then
    waits for the client, in the kernel's buffers and the server), then everything."""
    ended = {"tenant": tenant, "finished_reason": "length"}
    before = server.metric(SUCCESS, **ended)
    sock = stuck_client(server, body, tenant)
    wait_for_metric(server, SUCCESS, before, **ended)
    return read_all(sock)


def test_a_client_that_reads_slowly_gets_every_token_and_the_end(zero_server):
    chunks = events_of(read_slowly(zero_server, stream_body("sim:zero", TOKENS)))
    text = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert "".join(text) == " tok" * TOKENS
    assert chunks[-1]["usage"]["completion_tokens"] == TOKENS
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    # And the server is still quick for everyone else.
    quick = httpx.post(
        f"{zero_server.url}/v1/completions",
        json={"model": "sim:zero", "prompt": "hi", "max_tokens": 3},
        headers=zero_server.headers(),
        timeout=30,
    )
    assert quick.json()["usage"]["completion_tokens"] == 3


def kernel_send_buffer_max() -> int:
    """The most a TCP socket's kernel send buffer grows to (tcp_wmem's maximum)."""
    return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])


@pytest.mark.parametrize("n", [1, 8])
def test_a_client_that_stops_reading_is_cut_at_the_bound(bounded_server, n):
    """A stream that its client stopped reading holds at most the bound in the server:
    past it the stream is cut (counted), its engine requests are aborted long before
    their max_tokens, and the client, reading on, finds what it was sent (at most the
    bound beyond the kernel's buffers), the error, the usage of exactly that, [DONE]."""
    server = bounded_server
    tokens = 3 * TOKENS // n  # 15 MB of events in all: far more than the kernel holds
    cut_before = server.metric(CUT, tenant="team-a")
    aborted = {"tenant": "team-a", "finished_reason": "abort"}
    aborted_before = server.metric(SUCCESS, **aborted)
    sock = stuck_client(server, stream_body("sim:zero", tokens, n))
    wait_for_metric(server, CUT, cut_before, tenant="team-a")
    wait_for_metric(server, SUCCESS, aborted_before, **aborted)
    assert server.metric(CUT, tenant="team-a") == cut_before + 1  # one stream, once

    body = read_all(sock)
    chunks = events_of(body)
    error, usage = chunks[-2]["error"], chunks[-1]["usage"]
    assert error["code"] == "client_too_slow"
    assert "--max-stream-buffer-bytes" in error["message"]
    sent = [chunk["choices"][0] for chunk in chunks[:-2]]
    assert {choice["index"] for choice in sent} == set(range(n))
    assert all(choice["text"] == " tok" for choice in sent)  # sim: one token a chunk
    assert usage["completion_tokens"] == len(sent)
    assert len(sent) < n * tokens // 2  # cut, not run to its end
    # Everything the server wrote for it: what the kernel's buffers took, then at most
    # the bound plus the transport's own 64 KiB (and the events in hand at the cut).
    assert len(body) < kernel_send_buffer_max() + BOUND + (256 << 10)


@pytest.fixture(scope="module")
def plain_uvicorn() -> Iterator[str]:
    """The app under stock uvicorn (h11): no chunk writer, every token through `send`."""
    import uvicorn

    from tokenfair.edge.directory import TenantDirectory
    from tokenfair.server.app import create_app
    from tokenfair.server.model import build_served_model
    from tokenfair.server.routes import FastPath
    from tokenfair.server.state import ServerConfig

    served = build_served_model("sim:fixed:0.001", policy="vtc", weights={})
    app = create_app(served, TenantDirectory.open(False), ServerConfig())
    port = free_port()
    config = uvicorn.Config(
        FastPath(app), host="127.0.0.1", port=port, http="h11", loop="asyncio", log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(10)


def test_without_the_chunk_writer_every_token_goes_through_send(plain_uvicorn):
    with httpx.Client(base_url=plain_uvicorn, timeout=60) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        with client.stream("POST", "/v1/completions", json=stream_body(model, 50)) as response:
            assert response.status_code == 200
            chunks = events_of(response.read())
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == " tok" * 50
        assert chunks[-1]["usage"]["completion_tokens"] == 50
        whole = client.post(
            "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 7}
        ).json()
        assert whole["usage"]["completion_tokens"] == 7


def test_without_the_chunk_writer_several_choices_stream_with_their_index(plain_uvicorn):
    with httpx.Client(base_url=plain_uvicorn, timeout=60) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        with client.stream("POST", "/v1/completions", json=stream_body(model, 20, n=3)) as r:
            assert r.status_code == 200
            chunks = events_of(r.read())
    texts = ["", "", ""]
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == [" tok" * 20] * 3
    assert chunks[-1]["usage"]["completion_tokens"] == 60


def running_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tokenfair:num_requests_running")
    )


def test_without_the_chunk_writer_a_disconnect_still_aborts(plain_uvicorn):
    """No connection callback there: a task waiting on `receive` notices the client go."""
    with httpx.Client(base_url=plain_uvicorn, timeout=60) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        with client.stream("POST", "/v1/completions", json=stream_body(model, 8000)) as r:
            assert r.status_code == 200
            raw = r.iter_raw()  # held: a dropped iterator closes the response
            next(raw)  # streaming (8 s of tokens at 1 ms a step), then gone
            assert running_requests(plain_uvicorn) == 1
    deadline = time.monotonic() + 10
    while running_requests(plain_uvicorn) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_requests(plain_uvicorn) == 0


def test_the_chunk_writer_reports_a_client_already_gone_at_once():
    from types import SimpleNamespace

    from tokenfair.server.chunk_write import ChunkWriter

    calls: list[str] = []
    writer = ChunkWriter(SimpleNamespace(disconnected=True))
    writer.watch(lambda: calls.append("gone"))
    writer.watch(None)  # stops watching: nothing more
    assert calls == ["gone"]
