"""A real vLLM (the CPU build) behind the gateway: streaming, usage, disconnects, and
tenants cached apart by the gateway's cache_salt (`engine: vllm`).

Uses the project's vLLM environment (.venv-vllm); skipped with a message without it.
One vLLM process for the whole module (it takes about a minute to start).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.processes import KEYS, ROOT, Process, gateway, state
from tests.gateway.redis_server import free_port

pytestmark = pytest.mark.slow

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def _vllm_available() -> str | None:
    # An environment that exists must work (`make vllm-env` checked it imports): a broken
    # one fails the fixture with vLLM's own log rather than skipping the tests.
    if not VLLM_PYTHON.exists():
        return f"vLLM's environment is missing ({VLLM_PYTHON}); `make` builds it"
    return None


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    why = _vllm_available()
    if why is not None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("vllm")
    model = tmp / "tiny"
    subprocess.run(
        [str(VLLM_PYTHON), str(Path(__file__).with_name("vllm_model.py")), str(model)],
        check=True,
        timeout=300,
    )
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CACHE_ROOT": str(tmp / "cache"),
        "HF_HOME": str(tmp / "hf"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    }
    args = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
    ]
    args += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-num-seqs",
        "8",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    log = (tmp / "vllm.log").open("wb")
    server = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420  # 45-75 s on a quiet machine
        while True:
            if server.poll() is not None:
                pytest.fail(f"vLLM exited: {(tmp / 'vllm.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vLLM did not become healthy in 420 s: {(tmp / 'vllm.log').read_text()[-1500:]}"
                )
            time.sleep(1)
        upstream = {
            "url": url + "/v1",
            "models": ["tiny"],
            "max_concurrent": 4,
            "capacity_from_metrics": "vllm",
            "engine": "vllm",
        }
        gw: Process = gateway(tmp, [upstream], models={"tiny": {"tokenizer": str(model)}})
        try:
            yield {"url": url, "gateway": gw}
        finally:
            gw.stop()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _client(gw: Process, tenant: str = "other") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=120)


def test_streaming_with_usage_through_the_gateway(vllm: dict[str, Any]) -> None:
    before = state(vllm["gateway"])["counters"].get("other", 0.0)
    prompt = "t5 t6 t7 t8 t9 t10"
    chunks = list(
        _client(vllm["gateway"]).completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12
    assert sum(1 for c in chunks if c.choices) >= 1
    # The tenant paid exactly the usage vLLM reported: w_in * prompt + w_out * output.
    after = state(vllm["gateway"])["counters"]["other"]
    assert after - before == pytest.approx(usage.prompt_tokens + 2 * usage.completion_tokens)


def test_non_streaming_is_charged_by_its_usage(vllm: dict[str, Any]) -> None:
    before = state(vllm["gateway"])["counters"].get("other", 0.0)
    reply = _client(vllm["gateway"]).completions.create(
        model="tiny", prompt="t3 t4", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    after = state(vllm["gateway"])["counters"]["other"]
    assert after - before == pytest.approx(reply.usage.prompt_tokens + 2 * 5)


def test_a_disconnect_reaches_vllm(vllm: dict[str, Any]) -> None:
    gw = vllm["gateway"]
    body = {
        "model": "tiny",
        "prompt": "t3 t4 t5",
        "max_tokens": 1900,
        "stream": True,
        "ignore_eos": True,
    }
    headers = {"authorization": f"Bearer {KEYS['other']}"}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", gw.url + "/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        lines = response.iter_lines()
        assert next(line for line in lines if line).startswith("data: {")
        # vLLM updates its gauges as it steps: wait until it shows the request running.
        deadline = time.monotonic() + 20
        while _running(vllm["url"]) != 1 and time.monotonic() < deadline:
            next(lines)
        assert _running(vllm["url"]) == 1
    # The client is gone: the gateway closes its upstream request and vLLM aborts it.
    deadline = time.monotonic() + 20
    while _running(vllm["url"]) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(vllm["url"]) == 0
    assert state(gw)["upstreams"]["upstream-0"]["running"] == 0


def test_vllm_caches_each_tenant_apart(vllm: dict[str, Any]) -> None:
    """The gateway's cache_salt (and vllm_xargs, which vLLM takes without the plugin):
    another tenant's identical prompt finds nothing of it in vLLM's prefix cache. Last in
    the module: its tenants' counters would lift the others' (VTC's lift)."""
    prompt = " ".join(f"t{3 + i % 500}" for i in range(700))

    def cached(tenant: str) -> int:
        reply = _client(vllm["gateway"], tenant).completions.create(
            model="tiny", prompt=prompt, max_tokens=1
        )
        assert reply.usage is not None and reply.usage.prompt_tokens == 700
        details = reply.usage.prompt_tokens_details
        return (details.cached_tokens or 0) if details is not None else 0

    assert cached("light") == 0
    assert cached("light") > 0  # its own prompt again: cached, so this check can fail
    assert cached("heavy") == 0
