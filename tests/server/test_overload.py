"""Overload and bad input: 429 with Retry-After, 503, 413, 400 naming the limit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import ADMIN_KEY, KEYS, Server, launch, tenants_data

MODEL = "sim:fixed:0.01"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def one_seat(server_dir) -> Iterator[Server]:
    """One request runs at a time; 6 may wait in all; a 1,024-token KV pool."""
    server = launch(
        server_dir, "--model", MODEL, "--max-num-seqs", "1", "--max-waiting", "6",
        "--kv-tokens", "1024", "--max-body-bytes", "65536", tenants=tenants_data(),
    )  # fmt: skip
    yield server
    server.stop()


def post(server: Server, tenant: str, **body: object) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/completions",
        json={"model": MODEL, "prompt": "x", **body},
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=60,
    )


def test_waiting_limits_rpm_and_global_overload(one_seat):
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=one_seat.url, timeout=60) as c:

            def send(tenant: str, max_tokens: int = 1) -> asyncio.Task[httpx.Response]:
                return asyncio.ensure_future(
                    c.post(
                        "/v1/completions",
                        json={"model": MODEL, "prompt": "x", "max_tokens": max_tokens},
                        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
                    )
                )

            async def wait_waiting(n: int) -> None:
                for _ in range(200):
                    snapshot = await c.get("/metrics", headers=ADMIN)
                    total = sum(
                        float(line.rsplit(" ", 1)[1])
                        for line in snapshot.text.splitlines()
                        if line.startswith("tokenfair:num_requests_waiting{")
                    )
                    if total >= n:
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError(f"never saw {n} waiting")

            # team-a takes the only seat for a while (streaming, first token seen).
            body = {"model": MODEL, "prompt": "x", "max_tokens": 800, "stream": True}
            async with c.stream(
                "POST",
                "/v1/completions",
                json=body,
                headers={"Authorization": f"Bearer {KEYS['team-a']}"},
            ) as seat:
                lines = seat.aiter_lines()
                async for line in lines:
                    if line.startswith("data: {"):
                        break
                waiting = [send("team-c"), send("team-c")]
                await wait_waiting(2)
                third = await c.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                    headers={"Authorization": f"Bearer {KEYS['team-c']}"},
                )
                assert third.status_code == 429
                assert third.json()["error"]["code"] == "tenant_queue_full"
                assert int(third.headers["retry-after"]) >= 1
                others = [send("team-b") for _ in range(4)]
                await wait_waiting(6)
                full = await c.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                    headers={"Authorization": f"Bearer {KEYS['team-b']}"},
                )
                assert full.status_code == 503
                assert full.json()["error"]["code"] == "server_overloaded"
                assert "retry-after" in full.headers
            # The seat is given up (disconnect); everyone waiting gets served.
            for task in [*waiting, *others]:
                assert (await task).status_code == 200
            # team-c has 2 accepted; rpm 5 lets 3 more in this minute, then 429.
            for _ in range(3):
                assert (await send("team-c")).status_code == 200
            limited = await send("team-c")
            assert limited.status_code == 429
            assert limited.json()["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(limited.headers["retry-after"]) <= 60

    asyncio.run(scenario())
    rejected = one_seat.metric(
        "tokenfair:requests_rejected_total", tenant="team-c", reason="rate_limit_exceeded"
    )
    assert rejected == 1


def test_body_and_prompt_bounds(one_seat):
    huge = httpx.post(
        f"{one_seat.url}/v1/completions",
        content=b'{"model": "x", "prompt": "' + b"a" * 100_000 + b'"}',
        headers={"Authorization": f"Bearer {KEYS['team-a']}", "Content-Type": "application/json"},
    )
    assert huge.status_code == 413
    assert huge.json()["error"]["code"] == "body_too_large"
    # team-c allows 64 tokens per request: 400 bytes of prompt is 100 tokens.
    long_prompt = post(one_seat, "team-c", prompt="a" * 400, max_tokens=1)
    assert long_prompt.status_code == 400
    assert (
        "max_tokens_per_request of tenant 'team-c' (64 tokens)"
        in long_prompt.json()["error"]["message"]
    )
    too_many = post(one_seat, "team-c", prompt="a", max_tokens=100)
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "max_tokens"
    # team-a's bound is 8192, but the KV pool holds 1,024 tokens.
    never_fits = post(one_seat, "team-a", prompt="a" * 4000, max_tokens=100)
    assert never_fits.status_code == 400
    error = never_fits.json()["error"]
    assert "KV cache" in error["message"] and "1024" in error["message"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    # A prompt that alone overflows the pool names the prompt, whatever max_tokens is.
    alone = post(one_seat, "team-a", prompt="a" * 4400, max_tokens=1)  # 1,100 tokens
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "prompt"
    # Without max_tokens the default (256) is cut to what the pool leaves: 24 tokens.
    capped = post(one_seat, "team-a", prompt="a" * 4000)
    assert capped.status_code == 200, capped.text
    assert capped.json()["usage"]["completion_tokens"] == 24
    empty = post(one_seat, "team-a", prompt=[], max_tokens=1)
    assert empty.status_code == 400


def test_policy_rejection_is_429(server_dir):
    server = launch(server_dir, "--model", "sim:zero", "--policy", "rpm:2")
    try:
        codes = [
            httpx.post(
                f"{server.url}/v1/completions",
                json={"model": "sim:zero", "prompt": "x", "max_tokens": 1},
            ).status_code
            for _ in range(3)
        ]
        assert codes == [200, 200, 429]
    finally:
        with contextlib.suppress(Exception):
            server.stop()


def test_priority_field_orders_the_queue(server_dir):
    """--policy priority, one seat: waiting requests run lowest priority value first."""
    server = launch(
        server_dir, "--model", "sim:fixed:0.005", "--policy", "priority", "--max-num-seqs", "1"
    )

    async def scenario() -> list[str]:
        order: list[str] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:

            async def send(name: str, priority: int, max_tokens: int = 2) -> None:
                body = {
                    "model": "sim:fixed:0.005",
                    "prompt": name,
                    "max_tokens": max_tokens,
                    "priority": priority,
                }
                r = await c.post("/v1/completions", json=body)
                assert r.status_code == 200
                order.append(name)

            seat = asyncio.ensure_future(send("seat", -10, max_tokens=60))  # never preempted
            await asyncio.sleep(0.1)
            late = [asyncio.ensure_future(send(f"p{p}", p)) for p in (5, 9, -3, 1)]
            await asyncio.gather(seat, *late)
        return order

    try:
        assert asyncio.run(scenario()) == ["seat", "p-3", "p1", "p5", "p9"]
    finally:
        server.stop()


def test_priority_orders_a_tenants_requests_under_vtc(one_seat):
    """The default policy honours `priority` among one tenant's own requests."""

    async def scenario() -> list[str]:
        finished: list[str] = []
        async with httpx.AsyncClient(base_url=one_seat.url, timeout=60) as c:

            async def send(name: str, priority: int, max_tokens: int = 2) -> None:
                body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens}
                answer = await c.post(
                    "/v1/completions",
                    json={**body, "priority": priority},
                    headers={"Authorization": f"Bearer {KEYS['team-a']}"},
                )
                assert answer.status_code == 200, answer.text
                finished.append(name)

            seat = asyncio.ensure_future(send("seat", 10, max_tokens=40))  # 0.4 s
            await asyncio.sleep(0.1)
            tasks = [seat]
            for name, priority in (("lax1", 10), ("lax2", 10), ("urgent", -10), ("lax3", 10)):
                tasks.append(asyncio.ensure_future(send(name, priority)))
                await asyncio.sleep(0.02)  # arrival order is send order
            await asyncio.gather(*tasks)
        return finished

    finished = asyncio.run(scenario())
    # "seat" holds the one seat; of the waiting ones the urgent request goes first.
    assert finished == ["seat", "urgent", "lax1", "lax2", "lax3"]
