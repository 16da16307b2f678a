"""The gateway in front of two real upstreams, driven by the official openai client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.processes import (
    KEYS,
    Process,
    fake_upstream,
    gateway,
    state,
    stats,
    tenants_file,
)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("proxy")
    ups = [
        fake_upstream(tmp, "u0", token_interval=0.002),
        fake_upstream(tmp, "u1", token_interval=0.002),
    ]
    configs = [
        {"url": u.url + "/v1", "models": ["fake"], "max_concurrent": 4, "name": f"u{i}"}
        for i, u in enumerate(ups)
    ]
    gw = gateway(tmp, configs)
    try:
        yield {"gateway": gw, "upstreams": ups, "tmp": tmp}
    finally:
        gw.stop()
        for u in ups:
            u.stop()


def client(gw: Process, tenant: str = "light") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS[tenant], max_retries=0)


def test_chat_and_completions_streaming_and_not(pool: dict[str, Any]) -> None:
    c = client(pool["gateway"])
    chat = c.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hello there"}], max_tokens=5
    )
    assert chat.choices[0].message.content == "tok " * 5
    assert (
        chat.usage is not None
        and chat.usage.completion_tokens == 5
        and chat.usage.prompt_tokens == 3
    )
    text = c.completions.create(model="fake", prompt="a b c", max_tokens=3)
    assert text.choices[0].text == "tok " * 3
    chunks = list(
        c.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "x"}], max_tokens=7, stream=True
        )
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "tok " * 7
    # The gateway asked the upstream for usage; the client did not, so it sees no usage chunk.
    assert all(ch.usage is None for ch in chunks) and all(ch.choices for ch in chunks)
    with_usage = list(
        c.completions.create(
            model="fake",
            prompt="one two",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].usage is not None and with_usage[-1].usage.completion_tokens == 4


def test_async_client_spreads_over_both_upstreams(pool: dict[str, Any]) -> None:
    gw = pool["gateway"]
    before = [stats(u)["started"] for u in pool["upstreams"]]

    async def run() -> list[str]:
        c = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEYS["heavy"], max_retries=0)
        replies = await asyncio.gather(
            *(c.completions.create(model="fake", prompt="p", max_tokens=20) for _ in range(16))
        )
        await c.close()
        return [r.choices[0].text for r in replies]

    assert asyncio.run(run()) == ["tok " * 20] * 16
    after = [stats(u)["started"] for u in pool["upstreams"]]
    assert all(a - b >= 4 for a, b in zip(after, before, strict=True))  # least-loaded spreads them


def test_upstream_connections_are_kept_alive(pool: dict[str, Any]) -> None:
    """Sequential requests reuse the gateway's pooled connections to each upstream."""
    c = client(pool["gateway"])
    c.completions.create(model="fake", prompt="p", max_tokens=1)  # warm both pools
    c.completions.create(model="fake", prompt="p", max_tokens=1)
    before = [stats(u) for u in pool["upstreams"]]
    for _ in range(20):
        c.completions.create(model="fake", prompt="p", max_tokens=1)
    after = [stats(u) for u in pool["upstreams"]]
    assert sum(a["started"] - b["started"] for a, b in zip(after, before, strict=True)) == 20
    new = sum(a["connections"] - b["connections"] for a, b in zip(after, before, strict=True))
    assert new <= 2  # one at most per upstream, not one per request


def test_errors_have_the_openai_shape(pool: dict[str, Any]) -> None:
    gw = pool["gateway"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.url + "/v1", api_key="wrong", max_retries=0).completions.create(
            model="fake", prompt="x"
        )
    with pytest.raises(openai.NotFoundError) as missing:
        client(gw).completions.create(model="nope", prompt="x")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    for body, param in [
        (b"{", None),
        (b'{"model": "fake"}', "prompt"),
        (b'{"model": "fake", "prompt": "x", "max_tokens": 0}', "max_tokens"),
        (b"[]", None),
    ]:
        reply = httpx.post(
            gw.url + "/v1/completions",
            content=body,
            headers={"authorization": f"Bearer {KEYS['light']}"},
        )
        assert reply.status_code == 400
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
        assert reply.json()["error"]["param"] == param
    reply = httpx.get(gw.url + "/v1/nothing")
    assert reply.status_code == 404 and "error" in reply.json()
    models = client(gw).models.list()
    assert [m.id for m in models.data] == ["fake"]


def test_disconnect_closes_the_upstream_request(pool: dict[str, Any]) -> None:
    gw = pool["gateway"]
    slow = 400  # tokens at 2 ms: the stream would last ~0.8 s
    with (
        httpx.Client(timeout=10) as http,
        http.stream(
            "POST",
            gw.url + "/v1/completions",
            json={"model": "fake", "prompt": "x", "max_tokens": slow, "stream": True},
            headers={"authorization": f"Bearer {KEYS['light']}"},
        ) as response,
    ):
        for _ in response.iter_raw():
            break  # first bytes arrived; now vanish
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        s = state(gw)
        if (
            all(u["running"] == 0 for u in s["upstreams"].values())
            and sum(stats(u)["running"] for u in pool["upstreams"]) == 0
        ):
            break
        time.sleep(0.05)
    assert all(u["running"] == 0 for u in state(gw)["upstreams"].values())
    assert sum(stats(u)["aborted"] for u in pool["upstreams"]) >= 1
    assert sum(stats(u)["running"] for u in pool["upstreams"]) == 0


def test_metrics_use_the_server_names(pool: dict[str, Any]) -> None:
    client(pool["gateway"]).completions.create(model="fake", prompt="x y", max_tokens=2)
    text = httpx.get(pool["gateway"].metrics_url + "/metrics").text
    for name in [
        "tokenfair:num_requests_waiting",
        "tokenfair:prompt_tokens_total",
        "tokenfair:generation_tokens_total",
        "tokenfair:time_to_first_token_seconds",
        "tokenfair:vtc_counter",
        "tokenfair:gateway_upstream_healthy",
    ]:
        assert name in text, name
    assert 'tokenfair:generation_tokens_total{tenant="light"}' in text


def test_non_streaming_reserves_max_tokens_and_is_refunded_from_usage(pool: dict[str, Any]) -> None:
    gw = pool["gateway"]
    client(gw, "other").completions.create(model="fake", prompt="x", max_tokens=1)  # after its lift
    before = state(gw)["counters"]["other"]
    # No max_tokens: the gateway reserves its default (256); the upstream makes 16.
    reply = client(gw, "other").completions.create(model="fake", prompt="one two three")
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    after = state(gw)["counters"]["other"]
    assert after - before == pytest.approx(reply.usage.prompt_tokens + 2 * 16)


def test_tenant_limits(pool: dict[str, Any]) -> None:
    gw = pool["gateway"]
    tight = client(gw, "tight")
    with pytest.raises(openai.BadRequestError) as too_long:
        tight.completions.create(model="fake", prompt="x", max_tokens=200)
    assert too_long.value.body["param"] == "max_tokens"  # type: ignore[index]

    async def burst() -> list[int]:
        c = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEYS["tight"], max_retries=0)
        # Fill all 8 upstream slots with other tenants' long streams, then send two.
        hog = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEYS["heavy"], max_retries=0)
        hogs = [
            asyncio.ensure_future(hog.completions.create(model="fake", prompt="p", max_tokens=300))
            for _ in range(8)
        ]
        await asyncio.sleep(0.3)
        statuses = []
        for reply in await asyncio.gather(
            *(c.completions.create(model="fake", prompt="x", max_tokens=2) for _ in range(3)),
            return_exceptions=True,
        ):
            statuses.append(reply.status_code if isinstance(reply, openai.APIStatusError) else 200)
        await asyncio.gather(*hogs)
        await c.close()
        await hog.close()
        return sorted(statuses)

    # One may wait; the others are refused with 429 while it does.
    assert asyncio.run(burst()) == [200, 429, 429]


def test_rpm_limit_returns_429_with_retry_after(pool: dict[str, Any]) -> None:
    limited = client(pool["gateway"], "limited")
    for _ in range(2):  # refused as too long: they never count against the rate
        with pytest.raises(openai.BadRequestError):
            limited.completions.create(model="fake", prompt="x", max_tokens=9000)
    for _ in range(3):
        limited.completions.create(model="fake", prompt="x", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as raised:
        limited.completions.create(model="fake", prompt="x", max_tokens=1)
    # Until the first of the three leaves the 60 s window.
    assert 55 <= int(raised.value.response.headers["retry-after"]) <= 60
    assert raised.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]


def test_an_answer_without_usage_is_charged_for_its_text(pool: dict[str, Any]) -> None:
    gw = pool["gateway"]
    client(gw, "other").completions.create(model="fake", prompt="x", max_tokens=1)
    before = state(gw)["counters"]["other"]
    client(gw, "other").completions.create(
        model="fake", prompt="abcd", max_tokens=200, extra_body={"fake_no_usage": True}
    )
    # The prompt's estimate (1) plus w_out (2) x the text's: "tok " x 200 = 800 chars = 200.
    assert state(gw)["counters"]["other"] - before == pytest.approx(1 + 2 * 200)


def test_a_text_part_that_is_not_a_string_is_passed_on(pool: dict[str, Any]) -> None:
    body = {
        "model": "fake",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}],
    }
    answer = httpx.post(
        pool["gateway"].url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEYS['light']}"},
        timeout=30,
    )
    assert answer.status_code < 500, answer.text  # for the upstream to judge


def test_sighup_reloads_the_tenants_file_and_refuses_a_bad_one(pool: dict[str, Any]) -> None:
    import signal

    import yaml

    from tokenfair.edge.tenants import hash_key

    gw, path = pool["gateway"], pool["tmp"] / "tenants.yaml"
    original = path.read_text()
    data = yaml.safe_load(original)
    data["tenants"].append({"name": "newcomer", "key_sha256": [hash_key("key-new")]})
    try:
        path.write_text(yaml.safe_dump(data))
        gw.popen.send_signal(signal.SIGHUP)
        fresh = openai.OpenAI(base_url=gw.url + "/v1", api_key="key-new", max_retries=0)
        deadline = time.monotonic() + 5
        while True:
            try:
                fresh.completions.create(model="fake", prompt="x", max_tokens=1)
                break
            except openai.AuthenticationError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        path.write_text("tenants: [{name: broken, weight: -1}]\n")
        gw.popen.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        fresh.completions.create(model="fake", prompt="x", max_tokens=1)  # the old file stays
        assert "tenants file not reloaded" in gw.log.read_text()
    finally:
        path.write_text(original)
        gw.popen.send_signal(signal.SIGHUP)


def test_leaving_the_queue_costs_nothing_and_refunds_nothing(pool: dict[str, Any]) -> None:
    """A request that never reached an upstream was never charged: leaving the queue
    (a disconnect, here) must not refund its reservation either."""
    gw = pool["gateway"]
    client(gw, "other").completions.create(model="fake", prompt="x", max_tokens=1)
    before = state(gw)["counters"]["other"]
    service = tenant_service(gw, "other")

    async def scenario() -> None:
        hog = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEYS["heavy"], max_retries=0)
        hogs = [  # all 8 upstream slots, for 2 s at least: far longer than the three waits
            asyncio.ensure_future(hog.completions.create(model="fake", prompt="p", max_tokens=1000))
            for _ in range(8)
        ]
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=gw.url, timeout=0.15) as c:
            for _ in range(3):
                with pytest.raises(httpx.TimeoutException):  # gone while queued
                    await c.post(
                        "/v1/completions",
                        json={"model": "fake", "prompt": "x", "max_tokens": 4000},
                        headers={"Authorization": f"Bearer {KEYS['other']}"},
                    )
        await asyncio.gather(*hogs)
        await hog.close()

    asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while sum(state(gw)["waiting"].values()) or sum(state(gw)["running"].values()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # Its counter may only rise (lifted to the waiting tenants' as it came back; each
    # of the three would otherwise have refunded 2 x 4,000); no service is recorded.
    assert state(gw)["counters"]["other"] >= before
    assert tenant_service(gw, "other") == service


def tenant_service(gw: Process, tenant: str) -> float:
    text = httpx.get(gw.metrics_url + "/metrics", timeout=5).text
    prefix = f'tokenfair:tenant_service_total{{tenant="{tenant}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def test_a_trusted_tenant_header_names_the_tenant(
    pool: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Behind a proxy that authenticates, the tenants file's trusted header names the
    tenant; without it, the key does."""
    import yaml

    tmp = tmp_path_factory.mktemp("trusted")
    tenants = yaml.safe_load(tenants_file(tmp).read_text())
    path = tmp / "trusted.yaml"
    path.write_text(yaml.safe_dump({**tenants, "trusted_tenant_header": "x-tenant"}))
    configs = [
        {"url": u.url + "/v1", "models": ["fake"], "max_concurrent": 4, "name": f"u{i}"}
        for i, u in enumerate(pool["upstreams"])
    ]
    gw = gateway(tmp, configs, tenants=str(path))
    try:
        body = {"model": "fake", "prompt": "a b", "max_tokens": 2}
        named = httpx.post(gw.url + "/v1/completions", json=body, headers={"x-tenant": "heavy"})
        assert named.status_code == 200
        unknown = httpx.post(gw.url + "/v1/completions", json=body, headers={"x-tenant": "nobody"})
        assert unknown.status_code == 401 and "nobody" in unknown.json()["error"]["message"]
        keyed = client(gw, "other").completions.create(model="fake", prompt="a", max_tokens=2)
        assert keyed.choices[0].text == "tok " * 2
        counters = state(gw)["counters"]  # each paid for its own request
        assert counters.get("heavy", 0) > 0 and counters.get("other", 0) > 0
        assert counters.get("light", 0) == 0
    finally:
        gw.stop()
