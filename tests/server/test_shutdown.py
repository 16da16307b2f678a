"""Stopping the server: requests in flight get the grace period, then an answer.

SIGTERM gives them `--shutdown-timeout` seconds; past it a stream ends with an error
event and `[DONE]`, and a request still waiting for its answer gets a 503, rather than
a cut connection, a 500 and a traceback in the log.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, launch

MODEL = "sim:fixed:0.01"


def wait_for(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def waiting(server: Server) -> float:
    """Requests waiting, summed over tenants."""
    return sum(
        value
        for (name, _), value in server.metrics().items()
        if name == "tokenfair:num_requests_waiting"
    )


@pytest.mark.parametrize("engine", ["thread", "process"])
def test_requests_past_the_grace_period_are_answered(tmp_path: Path, engine: str) -> None:
    server: Server = launch(
        tmp_path, "--model", MODEL, "--max-num-seqs", "1", "--shutdown-timeout", "1",
        "--engine", engine,
    )  # fmt: skip
    try:
        events: list[str] = []
        answer: list[httpx.Response] = []
        first_token = threading.Event()

        def long_stream() -> None:  # 3,000 steps of 10 ms: far past the grace period
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 3000, "stream": True}
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        first_token.set()

        def waiting_request() -> None:  # the one seat is taken: it waits in the queue
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
            answer.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))

        streamer = threading.Thread(target=long_stream)
        streamer.start()
        assert first_token.wait(20)
        waiter = threading.Thread(target=waiting_request)
        waiter.start()
        wait_for(lambda: waiting(server) == 1)

        server.process.send_signal(signal.SIGTERM)
        streamer.join(30)
        waiter.join(30)
        code = server.process.wait(30)
    finally:
        server.stop()  # a no-op once it has exited

    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "shutting_down"
    assert len(events) > 50  # the grace period ran: about 100 tokens came first
    assert answer[0].status_code == 503
    assert answer[0].json()["error"]["code"] == "shutting_down"
    assert answer[0].headers["retry-after"] == "1"
    assert code == -signal.SIGTERM  # the signal's status, as uvicorn leaves it
    log = server.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log
