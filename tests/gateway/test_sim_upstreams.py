"""Two `tokenfair serve --model sim:` upstreams behind the gateway (capacity from their
own metrics), driven by the official openai client."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.processes import KEYS, Process, gateway, state
from tests.gateway.redis_server import free_port

pytestmark = pytest.mark.slow


def _serve(tmp: Path, name: str) -> Process:
    port = free_port()
    args = [
        sys.executable,
        "-c",
        "from tokenfair.cli import app; app()",
        "serve",
        "--model",
        "sim:a10g-llama-7b",
    ]
    args += [
        "--served-model-name",
        "sim",
        "--port",
        str(port),
        "--max-num-seqs",
        "4",
        "--log-level",
        "warning",
    ]
    return Process(args, port, tmp / f"{name}.log").start(timeout=60)


def _gauge(upstream: Process, name: str) -> float:
    text = httpx.get(upstream.url + "/metrics", timeout=5).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith(name + "_")
    )


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sim")
    ups = [_serve(tmp, "sim0"), _serve(tmp, "sim1")]
    configs = [
        {
            "url": u.url + "/v1",
            "models": ["sim"],
            "max_concurrent": 4,
            "capacity_from_metrics": "tokenfair",
            "name": f"sim{i}",
        }
        for i, u in enumerate(ups)
    ]
    gw = gateway(tmp, configs)
    try:
        yield {"gateway": gw, "upstreams": ups}
    finally:
        gw.stop()
        for u in ups:
            u.stop()


def test_openai_client_through_the_gateway_to_sim_servers(sims: dict[str, Any]) -> None:
    c = openai.OpenAI(base_url=sims["gateway"].url + "/v1", api_key=KEYS["light"], max_retries=0)
    reply = c.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hello"}], max_tokens=6
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    chunks = list(
        c.completions.create(
            model="sim",
            prompt="hello",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].text) >= 1

    async def many() -> None:
        a = openai.AsyncOpenAI(
            base_url=sims["gateway"].url + "/v1", api_key=KEYS["heavy"], max_retries=0
        )
        await asyncio.gather(
            *(a.completions.create(model="sim", prompt="p", max_tokens=16) for _ in range(16))
        )
        await a.close()

    asyncio.run(many())
    # Both servers did part of the work.
    assert all(_gauge(u, "tokenfair:generation_tokens_total") >= 16 * 3 for u in sims["upstreams"])


def test_a_disconnect_through_the_gateway_aborts_in_the_server(sims: dict[str, Any]) -> None:
    gw = sims["gateway"]
    body = {"model": "sim", "prompt": "x", "max_tokens": 3000, "stream": True}
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST",
            gw.url + "/v1/completions",
            json=body,
            headers={"authorization": f"Bearer {KEYS['light']}"},
        ) as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line).startswith("data: {")
        assert sum(_gauge(u, "tokenfair:num_requests_running") for u in sims["upstreams"]) == 1
    deadline = time.monotonic() + 10
    while (
        sum(_gauge(u, "tokenfair:num_requests_running") for u in sims["upstreams"])
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert sum(_gauge(u, "tokenfair:num_requests_running") for u in sims["upstreams"]) == 0
    assert all(u["running"] == 0 for u in state(gw)["upstreams"].values())
