"""Failures: an upstream killed mid-stream, an upstream that errors, Redis going away."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.gateway.processes import KEYS, fake_upstream, gateway, state, stats
from tests.gateway.redis_server import RedisServer

pytestmark = pytest.mark.slow


def _wait_until(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def test_upstream_killed_mid_stream_gives_a_clean_error_and_leaks_nothing(tmp_path: Path) -> None:
    doomed = fake_upstream(tmp_path, "doomed", token_interval=0.02)
    survivor = fake_upstream(tmp_path, "survivor", token_interval=0.02)
    config = [
        {"url": u.url, "models": ["fake"], "max_concurrent": 2, "name": u.log.stem}
        for u in (doomed, survivor)
    ]
    gw = gateway(tmp_path, config)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS["light"], max_retries=0)
    received: list[int] = []
    errors: list[BaseException] = []

    def stream() -> None:
        n = 0
        try:
            for chunk in client.completions.create(
                model="fake", prompt="x", max_tokens=100, stream=True
            ):
                n += len(chunk.choices)
        except openai.APIError as error:
            errors.append(error)
        received.append(n)

    try:
        threads = [threading.Thread(target=stream) for _ in range(4)]
        for t in threads:
            t.start()
        _wait_until(lambda: stats(doomed)["running"] == 2 and stats(survivor)["running"] == 2)
        time.sleep(0.3)
        doomed.kill()
        for t in threads:
            t.join(timeout=30)
        # The two streams on the killed upstream end in an error the client raises; the others finish.
        assert len(errors) == 2 and sorted(received)[2:] == [100, 100], (errors, received)
        assert all("failed mid-stream" in str(e) for e in errors)
        s = state(gw)
        assert s["upstreams"]["doomed"] == {"healthy": False, "running": 0, "inflight_tokens": 0}
        assert (
            s["upstreams"]["survivor"]["running"] == 0
            and s["upstreams"]["survivor"]["inflight_tokens"] == 0
        )
        assert s["waiting"] == {} and s["running"] == {}
        # Charged exactly what was served: the finished streams at the upstream's usage
        # (2 prompt tokens + 100 output each), the broken ones at the gateway's prompt
        # estimate (1 token) plus the chunks that reached the client.
        broken = sorted(received)[:2]
        expected = 2 * (2 + 2 * 100) + sum(1 + 2 * n for n in broken)
        assert s["counters"]["light"] == pytest.approx(expected)
        # New requests go to the survivor.
        reply = client.completions.create(model="fake", prompt="x", max_tokens=3)
        assert reply.choices[0].text == "tok " * 3
    finally:
        gw.stop()
        survivor.stop()
        doomed.stop()


def test_failure_before_the_first_byte_is_retried_once_elsewhere(tmp_path: Path) -> None:
    failing = fake_upstream(tmp_path, "failing", fail_status=503)
    good = fake_upstream(tmp_path, "good")
    gw = gateway(
        tmp_path,
        [
            {"url": u.url, "models": ["fake"], "max_concurrent": 8, "name": u.log.stem}
            for u in (failing, good)
        ],
        # Least-loaded tries the first-listed idle upstream first: the failing one.
        routing="least-loaded",
    )
    alone = gateway(
        tmp_path, [{"url": failing.url, "models": ["fake"], "max_concurrent": 8}], name="alone"
    )
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS["light"], max_retries=0)
        for _ in range(10):
            assert (
                client.completions.create(model="fake", prompt="x", max_tokens=2).choices[0].text
                == "tok tok "
            )
        assert stats(failing)["started"] == 0 and stats(good)["finished"] == 10
        # A 5xx answer counts against the upstream's health, as a failed request does.
        assert "upstream failing is out of rotation: answered 503" in gw.log.read_text()
        # With no other upstream, the client gets the upstream's own answer.
        with pytest.raises(openai.InternalServerError) as raised:
            openai.OpenAI(
                base_url=alone.url + "/v1", api_key=KEYS["light"], max_retries=0
            ).completions.create(model="fake", prompt="x")
        assert raised.value.status_code == 503 and "failing on purpose" in str(raised.value)
        assert state(alone)["counters"].get("light", 0.0) == 0.0  # nothing served, nothing charged
    finally:
        gw.stop()
        alone.stop()
        failing.stop()
        good.stop()


def test_redis_outage_and_recovery_with_requests_flowing(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    upstream = fake_upstream(tmp_path, "u", token_interval=0.001)
    gw = gateway(
        tmp_path,
        [{"url": upstream.url, "models": ["fake"], "max_concurrent": 4}],
        redis={"url": server.url, "namespace": "out"},
    )
    failures: list[BaseException] = []
    served = {"light": 0, "heavy": 0}
    stop = threading.Event()

    async def flow(tenant: str) -> None:
        client = openai.AsyncOpenAI(
            base_url=gw.url + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=20
        )
        while not stop.is_set():
            try:
                await client.completions.create(model="fake", prompt="a b", max_tokens=5)
                served[tenant] += 1
            except openai.APIError as error:
                failures.append(error)
        await client.close()

    runner = threading.Thread(target=_run_flows, args=(flow,))
    try:
        runner.start()
        _wait_until(lambda: served["light"] > 20)
        server.stop()
        _wait_until(lambda: state(gw)["degraded"])
        during = dict(served)
        _wait_until(
            lambda: (
                served["light"] > during["light"] + 20 and served["heavy"] > during["heavy"] + 20
            )
        )
        local = state(gw)["counters"]
        server.start()  # an empty Redis: the gateway re-seeds it
        _wait_until(lambda: not state(gw)["degraded"])
        after = dict(served)
        _wait_until(lambda: served["light"] > after["light"] + 20)
        stop.set()
        runner.join(timeout=30)
        assert failures == []
        shared = {
            k.decode(): float(v)
            for k, v in redis.Redis.from_url(server.url).hgetall("out:vtc").items()
            if not k.startswith(b"~")  # the hash's own fields (gateway/replicas/lua.py)
        }
        # Nothing the gateway counted during the outage was lost, and charging went on.
        for tenant, value in local.items():
            assert shared[tenant] >= value
        assert shared["light"] > local["light"]
    finally:
        stop.set()
        gw.stop()
        upstream.stop()
        server.stop()


def _run_flows(flow) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        await asyncio.gather(flow("light"), flow("heavy"), flow("heavy"))

    asyncio.run(main())


def test_no_upstream_in_rotation_is_a_quick_503(tmp_path: Path) -> None:
    from tests.gateway.redis_server import free_port

    gw = gateway(
        tmp_path,
        [{"url": f"http://127.0.0.1:{free_port()}", "models": ["fake"], "max_concurrent": 2}],
    )
    try:
        _wait_until(lambda: not state(gw)["upstreams"]["upstream-0"]["healthy"])
        client = openai.OpenAI(
            base_url=gw.url + "/v1", api_key=KEYS["light"], max_retries=0, timeout=10
        )
        with pytest.raises(openai.InternalServerError) as raised:
            client.completions.create(model="fake", prompt="x", max_tokens=1)
        assert raised.value.status_code == 503 and raised.value.body["code"] == "no_upstream"  # type: ignore[index]
    finally:
        gw.stop()


def test_requests_past_the_shutdown_grace_period_are_answered(tmp_path: Path) -> None:
    """SIGTERM: past --shutdown-timeout a relayed stream ends with an error event, the
    usage its client asked for, and [DONE]; a request still queued in the gateway gets
    a 503; the metrics port answers until the drain is over; no traceback, and no
    task left for uvicorn to cancel."""
    upstream = fake_upstream(tmp_path, "slow", token_interval=0.01)
    config = [{"url": upstream.url, "models": ["fake"], "max_concurrent": 1}]
    gw = gateway(tmp_path, config, cli=("--shutdown-timeout", "1"))
    try:
        headers = {"Authorization": f"Bearer {KEYS['light']}"}
        events: list[str] = []
        answer: list[httpx.Response] = []
        streaming = threading.Event()
        scraped: list[int] = []  # events received when a scrape succeeded after SIGTERM

        def long_stream() -> None:  # 3,000 tokens 10 ms apart: far past the grace period
            body = {
                "model": "fake",
                "prompt": "hi",
                "max_tokens": 3000,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            url = f"{gw.url}/v1/completions"
            with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        streaming.set()

        def queued() -> None:  # the upstream's one slot is taken: it waits in the gateway
            body = {"model": "fake", "prompt": "hi", "max_tokens": 4}
            url = f"{gw.url}/v1/completions"
            answer.append(httpx.post(url, json=body, headers=headers, timeout=60))

        streamer = threading.Thread(target=long_stream)
        streamer.start()
        assert streaming.wait(20)
        waiter = threading.Thread(target=queued)
        waiter.start()
        _wait_until(lambda: sum(state(gw)["waiting"].values()) == 1)
        assert gw.popen is not None
        gw.popen.send_signal(signal.SIGTERM)
        metrics = f"http://127.0.0.1:{gw.metrics_port}/metrics"
        while streamer.is_alive():
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(metrics, timeout=5).status_code == 200:
                    scraped.append(len(events))
            time.sleep(0.1)
        streamer.join(30)
        waiter.join(30)
        code = gw.popen.wait(30)
    finally:
        gw.stop()
        upstream.stop()

    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] >= 50 and usage["prompt_tokens"] > 0
    assert json.loads(events[-3])["error"]["code"] == "shutting_down"
    assert len(events) > 50  # the grace period ran first
    assert scraped and scraped[-1] > scraped[0]  # scraped while the drain streamed
    assert answer[0].status_code == 503
    assert answer[0].json()["error"]["code"] == "shutting_down"
    assert code == -signal.SIGTERM
    log = gw.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log
    assert "running task" not in log, log  # uvicorn's ERROR when it has to cancel


def test_a_timeout_mid_stream_ends_with_an_error_event(tmp_path: Path) -> None:
    upstream = fake_upstream(tmp_path, "slow", token_interval=0.05)
    gw = gateway(
        tmp_path, [{"url": upstream.url, "models": ["fake"], "max_concurrent": 2}],
        request_timeout_s=0.5,
    )  # fmt: skip
    try:
        body = {"model": "fake", "prompt": "x", "max_tokens": 60, "stream": True}
        headers = {"Authorization": f"Bearer {KEYS['light']}"}
        with httpx.stream(
            "POST", f"{gw.url}/v1/completions", json=body, headers=headers, timeout=30
        ) as response:
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "timeout"
        assert 2 < len(events) < 40  # some tokens came, then the timeout (60 would be 3 s)
    finally:
        gw.stop()
        upstream.stop()


def test_a_stream_whose_upstream_dies_ends_with_its_usage_and_done(tmp_path: Path) -> None:
    # As the server ends a stream it cuts: the error event, the usage it asked for (what
    # the tenant is charged: the chunks it got), then [DONE], so a client that counts
    # its tokens from the usage chunk, and one that waits for [DONE], both end cleanly.
    doomed = fake_upstream(tmp_path, "doomed", token_interval=0.02)
    config = [{"url": doomed.url, "models": ["fake"], "max_concurrent": 2, "name": "doomed"}]
    gw = gateway(tmp_path, config)
    body = {
        "model": "fake",
        "prompt": "x",
        "max_tokens": 200,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events: list[str] = []
    try:
        with httpx.stream(
            "POST",
            gw.url + "/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEYS['light']}"},
            timeout=30,
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 10:
                        doomed.kill()
    finally:
        gw.stop()
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])
    error = json.loads(events[-3])
    assert error["error"]["code"] == "upstream_unavailable"
    tokens = [json.loads(e) for e in events[:-3]]
    assert usage["choices"] == [] and usage["id"] == tokens[0]["id"]
    assert usage["usage"]["completion_tokens"] == sum(len(t["choices"]) for t in tokens) > 0
