"""End to end with vLLM's OpenAI server: `--scheduler-cls` loads the plugin in the
engine-core process, tenants arrive in `vllm_xargs`, the official openai client talks
to it, and the plugin's Prometheus endpoint shows the counters.

One server for the whole module. Under a flood the test checks order, not wall time:
a light tenant's request is let in ahead of the heavy tenant's queue.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.integrations.vllm.tiny_model import prompt_ids

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
MAX_NUM_SEQS = 4
MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    def __init__(self, model_dir: str, log: Path):
        self.port, self.metrics_port = free_port(), free_port()
        self.log = log
        settings = {
            "tokenfair": {"policy": "vtc", "log_interval_s": 1, "metrics_port": self.metrics_port}
        }
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_dir, "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "1024", "--dtype", "float32", "--enforce-eager",
            "--max-num-seqs", str(MAX_NUM_SEQS), "--no-enable-prefix-caching",
            "--scheduler-cls", "tokenfair.integrations.vllm.FairScheduler",
            "--additional-config", json.dumps(settings),
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's usual process layout
        self.process = subprocess.Popen(
            command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM server exited ({self.process.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        pytest.fail(f"vLLM server not healthy after {timeout_s} s:\n{self.log_tail()}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def metrics(self) -> dict[tuple[str, str], float]:
        """{(series, tenant): value} from the plugin's endpoint."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        values = {}
        for name, tenant, value in re.findall(
            r'^(tokenfair_vllm_\w+)\{engine="0",tenant="([^"]*)"\} (\S+)$', text, re.M
        ):
            values[(name, tenant)] = float(value)
        return values


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    running = Server(tiny_model_dir, tmp_path_factory.mktemp("vllm-server") / "server.log")
    try:
        running.wait_healthy()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def complete(client, tenant: str | None, prompt: int, output: int, seed: int):
    extra = {"ignore_eos": True}
    if tenant is not None:
        extra["vllm_xargs"] = {"tenant": tenant}
    return client.completions.create(
        model=MODEL,
        prompt=prompt_ids(prompt, seed),
        max_tokens=output,
        temperature=0.0,
        extra_body=extra,
    )


def test_tenants_from_vllm_xargs_in_the_metrics(server, client):
    sent = [("alice", 24, 6), ("alice", 40, 3), ("bob", 16, 5), (None, 8, 2)]
    usage = {}
    for i, (tenant, prompt, output) in enumerate(sent):
        response = complete(client, tenant, prompt, output, seed=i)
        assert response.usage.completion_tokens == output
        name = tenant or "default"
        done = usage.setdefault(name, [0, 0, 0])
        done[0] += response.usage.prompt_tokens
        done[1] += output
        done[2] += 1
    metrics = server.metrics()
    for tenant, (prompt_tokens, output_tokens, requests) in usage.items():
        assert metrics[("tokenfair_vllm_prompt_tokens_total", tenant)] == prompt_tokens
        assert metrics[("tokenfair_vllm_output_tokens_total", tenant)] == output_tokens
        assert metrics[("tokenfair_vllm_requests_total", tenant)] == requests
        # The counter is what the tenant was charged, on top of its lift on arrival.
        assert metrics[("tokenfair_vllm_counter", tenant)] >= prompt_tokens + 2 * output_tokens
        assert metrics[("tokenfair_vllm_waiting", tenant)] == 0


async def _stream(client, tenant, prompt, output, seed, log):
    sent = time.monotonic()
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt_ids(prompt, seed),
        max_tokens=output,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True, "vllm_xargs": {"tenant": tenant}},
    )
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.monotonic()
    log.append((tenant, sent, first))


async def _flood(url: str):
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    log: list[tuple[str, float, float | None]] = []
    heavy = [
        asyncio.create_task(_stream(client, "heavy", 64, 24 + (13 * i) % 32, i, log))
        for i in range(20)
    ]
    await asyncio.sleep(1.0)  # the flood is queued and running
    for i in range(4):
        await _stream(client, "light", 16, 4, 100 + i, log)
    await asyncio.gather(*heavy)
    await client.close()
    return log


def test_light_tenant_goes_ahead_of_a_flood(server):
    log = asyncio.run(_flood(server.url))
    heavy = [(sent, first) for tenant, sent, first in log if tenant == "heavy"]
    light = [(sent, first) for tenant, sent, first in log if tenant == "light"]
    assert all(first is not None for _, first in heavy + light)
    checked = 0
    for sent, first in light:
        queued = sum(1 for _, h_first in heavy if h_first > sent)
        if queued < 2 * MAX_NUM_SEQS:
            continue  # the flood was nearly over: nothing to jump
        checked += 1
        # FCFS would start every queued heavy request first; VTC lets light in at the
        # next free seat (a few heavy requests may start in the same steps).
        started_meanwhile = sum(1 for _, h_first in heavy if sent < h_first < first)
        assert started_meanwhile <= MAX_NUM_SEQS, (started_meanwhile, queued)
    assert checked >= 2, "the light requests were meant to arrive during the flood"


def test_status_line_in_vllms_log(server, client):
    complete(client, "carol", 16, 4, seed=7)
    deadline = time.monotonic() + 30
    while "tokenfair vtc:" not in server.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, server.log_tail()
        complete(client, "carol", 16, 40, seed=8)  # the line is written while busy
    line = next(line for line in server.log.read_text().splitlines() if "tokenfair vtc:" in line)
    assert re.search(r"tokenfair vtc: \d+ tenants, \d+ running, \d+ waiting \| ", line)


@pytest.mark.parametrize("tenant", [["x", "y"], {"a": 1}, 3.5, ""])
def test_odd_tenant_values_never_break_the_server(server, tenant):
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={
            "model": MODEL,
            "prompt": prompt_ids(8, 1),
            "max_tokens": 2,
            "vllm_xargs": {"tenant": tenant},
        },
        timeout=60,
    )
    assert response.status_code in (200, 400), response.text
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
