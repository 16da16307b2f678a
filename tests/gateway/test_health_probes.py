"""The gateway's probes go through its one HTTP client (`UpstreamClient.get`): the
pool's health checks and /metrics scrapes, and `probe` (for `--check` and the start).
Against tiny asyncio servers: one that answers, one that never does, and a port where
nothing listens."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from tests.gateway.redis_server import free_port
from tokenfair.gateway import reach as probe_module
from tokenfair.gateway.config import GatewayConfig, HealthConfig, UpstreamConfig
from tokenfair.gateway.upstreams.client import UpstreamClient
from tokenfair.gateway.upstreams.pool import UpstreamPool

Run = Callable[[Coroutine[Any, Any, Any]], Any]

VLLM_METRICS = (
    b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n"
    b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 4.0\n"
)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    return asyncio.run if request.param == "asyncio" else uvloop.run


class Upstream:
    """Answers GETs with `status` (and /metrics with vLLM's gauges); with `status`
    None it reads the request and never answers."""

    def __init__(self, status: int | None = 200) -> None:
        self.status = status
        self.heads: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> Upstream:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                if self.status is None:
                    await asyncio.Event().wait()
                body = VLLM_METRICS if head.startswith(b"GET /metrics ") else b"ok"
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n" % (self.status, len(body))
                )
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()


def _config(url: str, **fields: Any) -> UpstreamConfig:
    return UpstreamConfig(
        **{"url": url, "name": "u", "models": ["m"], "max_concurrent": 4, **fields}
    )


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


def test_get_reads_a_whole_answer_and_keeps_the_connection(run: Run) -> None:
    async def main() -> None:
        upstream = await Upstream().start()
        client = UpstreamClient(upstream.url + "/v1", {"accept-encoding": "identity"})
        assert await client.get("/health", 1.0) == (200, b"ok")
        assert await client.get("/health", 1.0) == (200, b"ok")
        await client.close()
        upstream.stop()
        assert upstream.connections == 1
        assert upstream.heads[0].startswith(b"GET /v1/health HTTP/1.1\r\n")
        assert b"authorization" not in upstream.heads[0]

    run(main())


def test_get_from_an_upstream_that_never_answers_times_out(run: Run) -> None:
    async def main() -> float:
        upstream = await Upstream(status=None).start()
        client = UpstreamClient(upstream.url)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await client.get("/health", 0.3)
        elapsed = time.monotonic() - start
        assert client.idle_connections == 0  # the unanswered connection is closed
        await client.close()
        upstream.stop()
        return elapsed

    assert 0.25 < run(main()) < 2.0


def test_probe_names_what_answers_and_what_does_not(
    monkeypatch: pytest.MonkeyPatch, run: Run
) -> None:
    monkeypatch.setattr(probe_module, "PROBE_TIMEOUT_S", 0.3)

    async def main() -> list[probe_module.Reach]:
        healthy, failing, silent = Upstream(200), Upstream(503), Upstream(None)
        for upstream in (healthy, failing, silent):
            await upstream.start()
        nobody = f"http://127.0.0.1:{free_port()}"
        config = GatewayConfig(
            upstreams=[
                _config(u, name=name)
                for u, name in (
                    (healthy.url, "healthy"),
                    (failing.url, "failing"),
                    (silent.url, "silent"),
                    (nobody, "nobody"),
                )
            ]
        )
        start = time.monotonic()
        reached = await probe_module.probe(config)
        assert time.monotonic() - start < 2.0  # asked together, each within the timeout
        for upstream in (healthy, failing, silent):
            upstream.stop()
        return reached

    healthy, failing, silent, nobody = run(main())
    assert (healthy.ok, healthy.detail) == (True, "healthy")
    assert (failing.ok, failing.detail) == (False, "/health answered 503")
    assert (silent.ok, silent.detail) == (False, "unreachable (TimeoutError)")
    assert (nobody.ok, nobody.detail) == (False, "unreachable (ConnectionRefusedError)")
    assert nobody.line().startswith("upstream nobody (http://127.0.0.1:")


def _pool(url: str, **fields: Any) -> UpstreamPool:
    health = HealthConfig(interval_s=0.05, timeout_s=0.2, fail_after=2, metrics_interval_s=0.05)
    return UpstreamPool([_config(url, **fields)], health)


def test_health_checks_take_a_silent_upstream_out_and_put_it_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        upstream = await Upstream(status=None).start()
        pool = _pool(upstream.url)
        pool.start()
        (one,) = pool.upstreams
        start = time.monotonic()
        await _until(lambda: not one.healthy)
        assert time.monotonic() - start >= 0.2  # each check waited out its timeout
        upstream.status = 200
        await _until(lambda: one.healthy)
        assert one.failures == 0
        await pool.close()
        upstream.stop()

    with caplog.at_level(logging.INFO, logger="tokenfair.gateway"):
        asyncio.run(main())
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    # Going out of rotation is a warning; coming back is news, not a problem.
    assert levels["upstream u is out of rotation: health check failed (TimeoutError)"] == (
        logging.WARNING
    )
    assert levels["upstream u is back in rotation"] == logging.INFO


def test_health_checks_of_a_port_where_nothing_listens(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        pool = _pool(f"http://127.0.0.1:{free_port()}")
        pool.start()
        await _until(lambda: not pool.upstreams[0].healthy)
        await pool.close()

    with caplog.at_level(logging.WARNING, logger="tokenfair.gateway"):
        asyncio.run(main())
    assert "out of rotation: health check failed (ConnectionRefusedError)" in caplog.text


def test_an_upstream_answering_its_health_check_with_an_error_is_out() -> None:
    async def main() -> None:
        upstream = await Upstream(status=503).start()
        pool = _pool(upstream.url)
        pool.start()
        await _until(lambda: not pool.upstreams[0].healthy)
        assert pool.upstreams[0].failures >= 2
        await pool.close()
        upstream.stop()

    asyncio.run(main())


def test_the_load_is_scraped_from_the_upstreams_metrics() -> None:
    async def main() -> None:
        upstream = await Upstream().start()
        pool = _pool(upstream.url, capacity_from_metrics="vllm")
        pool.start()
        (one,) = pool.upstreams
        await _until(lambda: one.reported is not None)
        assert one.reported == 7.0
        upstream.status = None  # a scrape that times out falls back to the own count
        await _until(lambda: one.reported is None)
        await pool.close()
        upstream.stop()

    asyncio.run(main())
