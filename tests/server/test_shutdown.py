"""Stopping the server: requests in flight get the grace period, then an answer.

SIGTERM gives them `--shutdown-timeout` seconds; past it the server cuts them itself: a
stream ends with an error event, the usage of what it was sent (when asked) and
`[DONE]`, and a request still waiting for its answer gets a 503, rather than a cut
connection, a 500 and a traceback, or an error in the log for an ordinary stop.
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


def stream_events(server: Server, body: dict, events: list[str], started: threading.Event) -> None:
    """Read a stream's events (their JSON, or [DONE]) into `events`."""
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                started.set()


def check_cut_stream(events: list[str], choices: int) -> None:
    """A stream cut at shutdown: its tokens, the error, the usage of exactly the tokens
    it was sent, [DONE]."""
    assert events[-1] == "[DONE]"
    assert json.loads(events[-3])["error"]["code"] == "shutting_down"
    usage = json.loads(events[-2])["usage"]
    chunks = [json.loads(event) for event in events[:-3]]
    tokens = [choice for chunk in chunks for choice in chunk["choices"] if choice["text"]]
    assert usage["completion_tokens"] == len(tokens)  # sim: one token a chunk
    assert {choice["index"] for choice in tokens} == set(range(choices))
    assert len(tokens) > 50 * choices  # the grace period ran: about 100 tokens each came first


@pytest.mark.parametrize("engine", ["thread", "process"])
def test_requests_past_the_grace_period_are_answered(tmp_path: Path, engine: str) -> None:
    server: Server = launch(
        tmp_path, "--model", MODEL, "--max-num-seqs", "3", "--shutdown-timeout", "1",
        "--engine", engine, "--log-level", "info",
    )  # fmt: skip
    try:
        # 3,000 steps of 10 ms: far past the grace period; one choice, and two.
        long = {"model": MODEL, "prompt": "hi", "max_tokens": 3000, "stream": True}
        long["stream_options"] = {"include_usage": True}
        one: list[str] = []
        two: list[str] = []
        started = [threading.Event(), threading.Event()]
        streamers = [
            threading.Thread(target=stream_events, args=(server, long, one, started[0])),
            threading.Thread(
                target=stream_events, args=(server, {**long, "n": 2}, two, started[1])
            ),
        ]
        for streamer in streamers:
            streamer.start()
        assert all(event.wait(20) for event in started)
        answer: list[httpx.Response] = []

        def waiting_request() -> None:  # the three seats are taken: it waits in the queue
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
            answer.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))

        waiter = threading.Thread(target=waiting_request)
        waiter.start()
        wait_for(lambda: waiting(server) == 1)

        server.process.send_signal(signal.SIGTERM)
        for thread in (*streamers, waiter):
            thread.join(30)
        code = server.process.wait(30)
    finally:
        server.stop()  # a no-op once it has exited

    check_cut_stream(one, choices=1)
    check_cut_stream(two, choices=2)
    assert answer[0].status_code == 503
    assert answer[0].json()["error"]["code"] == "shutting_down"
    assert answer[0].headers["retry-after"] == "1"
    assert code == -signal.SIGTERM  # the signal's status, as uvicorn leaves it
    log = server.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log
    # An orderly stop: what still ran was cut, and the log says so, without an error.
    assert "2 streams and 1 other requests still running after the grace period" in log
    assert "ERROR" not in log, log
