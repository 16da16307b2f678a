"""The server's count of requests that arrived and wait for their handler (Intake): up
on arrival, down when the handler starts, back to zero whatever the client does."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import free_port
from tokenfair.server.intake import Intake


class CountingIntake(Intake):
    """Intake keeping every value its count took."""

    def __init__(self) -> None:
        self.history: list[int] = []
        super().__init__()

    @property  # type: ignore[override]
    def arrived(self) -> int:
        return self.history[-1]

    @arrived.setter
    def arrived(self, value: int) -> None:
        self.history.append(value)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, CountingIntake]]:
    """The app under uvicorn with tokenfair's protocol, as `tokenfair serve` runs it."""
    import uvicorn

    from tokenfair.edge.directory import TenantDirectory
    from tokenfair.server.app import create_app
    from tokenfair.server.chunk_write import chunk_write_protocol
    from tokenfair.server.model import build_served_model
    from tokenfair.server.routes import FastPath
    from tokenfair.server.state import ServerConfig

    app = create_app(
        build_served_model("sim:fixed:0.001", policy="vtc", weights={}),
        TenantDirectory.open(False),
        ServerConfig(),
    )
    intake = CountingIntake()
    app.state.server.engine.urgent_work = intake.pending
    port = free_port()
    config = uvicorn.Config(
        FastPath(app),
        host="127.0.0.1",
        port=port,
        http=chunk_write_protocol(intake),
        loop="asyncio",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", intake
    server.should_exit = True
    thread.join(10)


def settles_at_zero(intake: Intake) -> bool:
    deadline = time.monotonic() + 10
    while intake.arrived and time.monotonic() < deadline:
        time.sleep(0.01)
    return intake.arrived == 0


def request_bytes(port: int, body: bytes) -> bytes:
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_a_request_counts_until_its_handler_starts(served):
    url, intake = served
    with httpx.Client(base_url=url, timeout=30) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        assert settles_at_zero(intake)
        before = len(intake.history)
        body = {"model": model, "prompt": "hi", "max_tokens": 2000, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as response:
            raw = response.iter_raw()  # held: a dropped iterator closes the response
            next(raw)  # the handler runs and streams (2 s of tokens): counted no more
            assert intake.history[before:] == [1, 0]


def test_requests_of_every_kind_leave_the_count_at_zero(served):
    url, intake = served
    with httpx.Client(base_url=url, timeout=30) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "hi", "max_tokens": 3}
        assert client.post("/v1/completions", json=body).status_code == 200
        assert client.post("/v1/completions", json={**body, "stream": True}).status_code == 200
        assert client.post("/v1/completions", json={"model": model}).status_code == 400
        assert client.get("/health").status_code == 200
    assert settles_at_zero(intake)


def test_pipelined_requests_and_vanishing_clients_leave_it_at_zero(served):
    url, intake = served
    port = int(url.rsplit(":", 1)[1])
    body = b'{"model": "sim:fixed:0.001", "prompt": "hi", "max_tokens": 2}'
    with socket.create_connection(("127.0.0.1", port)) as sock:  # two in one write
        sock.sendall(request_bytes(port, body) * 2)
        received = b""
        while received.count(b"HTTP/1.1 200") < 2:
            received += sock.recv(65536)
    for _ in range(20):  # headers in, then gone before (or while) the handler runs
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request_bytes(port, body)[:-5])
    assert settles_at_zero(intake)
