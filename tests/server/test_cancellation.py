"""Disconnects, timeouts and operator aborts free the slot and the KV blocks at once."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from tests.server.conftest import ADMIN_KEY, KEYS, Server


def wait_until_idle(server: Server, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        metrics = server.metrics()
        running = sum(
            v for (name, _), v in metrics.items() if name == "tokenfair:num_requests_running"
        )
        waiting = sum(
            v for (name, _), v in metrics.items() if name == "tokenfair:num_requests_waiting"
        )
        blocks = metrics[("tokenfair:kv_cache_used_blocks", ())]
        if running == waiting == blocks == 0 or time.monotonic() > deadline:
            return {"running": running, "waiting": waiting, "blocks": blocks, "metrics": metrics}
        time.sleep(0.05)


def aborted(server: Server, tenant: str = "team-a") -> float:
    return server.metric("tokenfair:request_success_total", tenant=tenant, finished_reason="abort")


async def vanish_mid_stream(server: Server, tenant: str, stream: bool) -> bool:
    """Open a request over a raw socket, read its first event (or wait), then hang up."""
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(
        {
            "model": "sim:fixed:0.002",
            "prompt": "disconnect me",
            "max_tokens": 5000,
            "stream": stream,
        }
    ).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEYS[tenant]}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    got_data = False
    if stream:
        seen = b""
        while b"data: {" not in seen:
            chunk = await asyncio.wait_for(reader.read(4096), 30)
            if not chunk:
                break
            seen += chunk
        got_data = b"data: {" in seen
    else:
        await asyncio.sleep(0.3)
    writer.transport.abort()  # vanish: no FIN handshake niceties
    return got_data


def test_disconnect_storm_frees_every_slot_and_block(any_sim_server):
    before = aborted(any_sim_server)

    async def storm() -> list[bool]:
        return await asyncio.gather(
            *(vanish_mid_stream(any_sim_server, "team-a", True) for _ in range(200))
        )

    started = asyncio.run(storm())
    assert all(started), "every client saw tokens before vanishing"
    idle = wait_until_idle(any_sim_server)
    assert idle["running"] == 0
    assert idle["waiting"] == 0
    assert idle["blocks"] == 0
    assert aborted(any_sim_server) - before == 200


def test_non_streaming_disconnect_aborts(any_sim_server):
    before = aborted(any_sim_server)

    async def go() -> None:
        await asyncio.gather(
            *(vanish_mid_stream(any_sim_server, "team-a", False) for _ in range(5))
        )

    asyncio.run(go())
    assert wait_until_idle(any_sim_server)["blocks"] == 0
    assert aborted(any_sim_server) - before == 5


def test_tenant_timeout_ends_the_request(any_sim_server):
    body = {"model": "sim:fixed:0.002", "prompt": "long", "max_tokens": 8000}
    started = time.monotonic()
    r = httpx.post(
        f"{any_sim_server.url}/v1/completions",
        json=body,
        headers=any_sim_server.headers("slow"),
        timeout=30,
    )
    assert r.status_code == 408
    assert r.json()["error"]["code"] == "timeout"
    assert time.monotonic() - started < 10  # 0.3 s timeout, far from 200 s of generation
    with httpx.stream(
        "POST", f"{any_sim_server.url}/v1/completions", json={**body, "stream": True},
        headers=any_sim_server.headers("slow"), timeout=30,
    ) as stream:  # fmt: skip
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["code"] == "timeout"
    assert wait_until_idle(any_sim_server)["blocks"] == 0


@pytest.mark.parametrize("n", [1, 2])
def test_a_stream_cut_by_its_timeout_reports_the_usage_it_was_sent(any_sim_server, n):
    body = {
        "model": "sim:fixed:0.002",
        "prompt": "long",
        "max_tokens": 8000,
        "n": n,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", f"{any_sim_server.url}/v1/completions", json=body,
        headers=any_sim_server.headers("slow"), timeout=30,
    ) as stream:  # fmt: skip
        events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error, usage = json.loads(events[-3]), json.loads(events[-2])
    assert error["error"]["code"] == "timeout"
    streamed = sum(1 for e in events[:-3] for c in json.loads(e)["choices"] if c["text"])
    assert usage["choices"] == []
    assert 0 < usage["usage"]["completion_tokens"] == streamed < 8000 * n
    assert wait_until_idle(any_sim_server)["blocks"] == 0


def test_admin_aborts_a_request_by_id(any_sim_server):
    body = {"model": "sim:fixed:0.002", "prompt": "abort me", "max_tokens": 8000, "stream": True}
    with httpx.stream(
        "POST",
        f"{any_sim_server.url}/v1/completions",
        json=body,
        headers=any_sim_server.headers(),
        timeout=30,
    ) as stream:
        request_id = stream.headers["x-request-id"]
        refused = httpx.post(
            f"{any_sim_server.url}/admin/requests/{request_id}/abort",
            headers=any_sim_server.headers("team-a"),
        )
        assert refused.status_code == 403
        done = httpx.post(
            f"{any_sim_server.url}/admin/requests/{request_id}/abort",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert done.status_code == 200
        events = [
            json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")
        ]
    assert events[-1]["choices"][0]["finish_reason"] == "abort"
    assert len(events) < 1000
    missing = httpx.post(
        f"{any_sim_server.url}/admin/requests/nope/abort",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert missing.status_code == 404


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_max_tokens_ends_in_its_step(any_sim_server, max_tokens):
    r = httpx.post(
        f"{any_sim_server.url}/v1/completions",
        json={"model": "sim:fixed:0.002", "prompt": "x", "max_tokens": max_tokens},
        headers=any_sim_server.headers(),
        timeout=30,
    )
    assert r.json()["usage"]["completion_tokens"] == max_tokens


def test_admin_lists_requests_in_flight_and_aborts_a_non_streaming_one(any_sim_server):
    """A non-streaming request's id comes with its answer: the list is how it is found."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"model": "sim:fixed:0.002", "prompt": "find me", "max_tokens": 8000}
    answers: list[httpx.Response] = []
    caller = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                f"{any_sim_server.url}/v1/completions",
                json=body,
                headers=any_sim_server.headers("team-b"),
                timeout=60,
            )
        )
    )
    caller.start()
    deadline = time.monotonic() + 20
    rows: list[dict] = []
    while not rows:
        assert time.monotonic() < deadline
        listing = httpx.get(
            f"{any_sim_server.url}/admin/requests", params={"tenant": "team-b"}, headers=admin
        )
        assert listing.status_code == 200
        rows = [row for row in listing.json()["data"] if row["completion_tokens"] > 0]
        time.sleep(0.02)
    (row,) = rows
    assert row["tenant"] == "team-b" and row["started"] and row["age_s"] > 0
    refused = httpx.get(f"{any_sim_server.url}/admin/requests", headers=any_sim_server.headers())
    assert refused.status_code == 403
    done = httpx.post(f"{any_sim_server.url}/admin/requests/{row['id']}/abort", headers=admin)
    assert done.status_code == 200
    caller.join(30)
    answer = answers[0].json()
    assert answer["id"] == row["id"] and answer["choices"][0]["finish_reason"] == "abort"
    assert answer["usage"]["completion_tokens"] < 8000
