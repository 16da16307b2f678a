"""The 3-level tree of hierarchical_shares.py through `tokenfair serve --model sim:...`.

The server steps at the pace of the simulated A10G (its profile's step times, slept on
the wall clock). The backlogged keys each keep 24 requests open (closed loops; far more
than their share of the batch), the light key sends one every 2 s on average (Poisson).
Service per group comes from the server's /metrics (`tokenfair:group_service_total`, read at
the start and the end of the measured window); the light key's TTFT from the server's
own record (`/admin/requests/recent`, engine time). Both are measured after a warm-up:
the first wave of requests starts together and none ends for ~10 s.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"heavy": "k-heavy", "light": "k-light", "ads": "k-ads", "bx": "k-bx", "by": "k-by"}
ADMIN = "k-admin"
OPEN_PER_KEY = 24
# The first requests all start together and run ~10 s (256 steps) before any ends: the
# measurements start after that.
WARMUP_S = 15.0
PROMPT = "x" * 1024  # 256 tokens on sim: (one per 4 bytes)


def tenants_file(path: Path) -> None:
    from tokenfair.edge.tenants import hash_key

    groups = {"org-a": {"weight": 2, "groups": {"search": {}, "ads": {}}},
              "org-b": {"groups": {"x": {}, "y": {}}}}  # fmt: skip
    place = {"heavy": "org-a/search", "light": "org-a/search", "ads": "org-a/ads",
             "bx": "org-b/x", "by": "org-b/y"}  # fmt: skip
    tenants = [
        {"name": n, "group": place[n], "key_sha256": hash_key(k), "max_waiting": 4096}
        for n, k in KEYS.items()
    ]
    path.write_text(yaml.safe_dump({"admin_key_sha256": hash_key(ADMIN), "groups": groups,
                                    "tenants": tenants}))  # fmt: skip


def group_service(url: str) -> dict[str, float]:
    admin = {"Authorization": f"Bearer {ADMIN}"}  # /metrics is the operator's
    text = httpx.get(f"{url}/metrics", headers=admin, timeout=30).text
    return {
        sample.labels["group"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tokenfair:group_service_total"
    }


async def closed_loop(client: httpx.AsyncClient, key: str, stop: float, max_tokens: int) -> None:
    body = {"model": "sim:a10g-llama-7b", "prompt": PROMPT, "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < stop:
        await client.post("/v1/completions", json=body, headers=headers)


async def light_loop(client: httpx.AsyncClient, stop: float, seed: int) -> None:
    rng = random.Random(seed)
    body = {"model": "sim:a10g-llama-7b", "prompt": "y" * 128, "max_tokens": 32}
    await asyncio.sleep(WARMUP_S)  # measured once everyone is backlogged
    headers = {"Authorization": f"Bearer {KEYS['light']}"}
    tasks = []
    while time.monotonic() < stop:
        await asyncio.sleep(rng.expovariate(0.5))
        tasks.append(asyncio.ensure_future(client.post("/v1/completions", json=body,
                                                       headers=headers)))  # fmt: skip
    await asyncio.gather(*tasks)


async def drive(url: str, keys: list[str], duration: float, seed: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        stop = time.monotonic() + duration
        loops = [closed_loop(client, KEYS[k], stop, 256) for k in keys for _ in range(OPEN_PER_KEY)]
        runner = asyncio.gather(*loops, light_loop(client, stop, seed))
        await asyncio.sleep(WARMUP_S)  # everyone backlogged by then
        start = group_service(url)
        await asyncio.sleep(duration - WARMUP_S)
        end = group_service(url)
        await runner
    return {g: end.get(g, 0.0) - start.get(g, 0.0) for g in end}


def serve(tenants: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tokenfair.cli", "serve", "--model", "sim:a10g-llama-7b",
               "--tenants", str(tenants), "--port", str(port), "--kv-tokens", "10000",
               "--max-num-seqs", "256", "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not come up")


def light_ttft_p90(url: str) -> float:
    rows = httpx.get(
        f"{url}/admin/requests/recent",
        params={"tenant": "light", "limit": 2048},
        headers={"Authorization": f"Bearer {ADMIN}"},
    ).json()["data"]
    values = sorted(r["ttft_s"] for r in rows if r["ttft_s"] is not None)
    return values[min(len(values) - 1, int(0.9 * len(values)))]


def one_run(keys: list[str], duration: float, seed: int) -> tuple[dict[str, float], float]:
    from benchmarks.server_tools.common import free_port

    with tempfile.TemporaryDirectory() as folder:
        tenants = Path(folder) / "tenants.yaml"
        tenants_file(tenants)
        port = free_port()
        process = serve(tenants, port)
        try:
            url = f"http://127.0.0.1:{port}"
            service = asyncio.run(drive(url, keys, duration, seed))
            return service, light_ttft_p90(url)
        finally:
            process.terminate()
            process.wait(30)


def run_server(duration: float, seed: int) -> dict[str, object]:
    from benchmarks.hierarchical_shares import LEVELS

    service, light = one_run(["heavy", "ads", "bx", "by"], duration, seed)
    _, alone = one_run(["ads", "bx", "by"], duration, seed)
    levels = {}
    for level, targets in LEVELS.items():
        total = sum(service.get(g, 0.0) for g in targets)
        for group, target in targets.items():
            share = service.get(group, 0.0) / total if total else 0.0
            levels[f"{level}: {group}"] = {
                "share": round(share, 4),
                "target": round(target, 4),
                "deviation": round(abs(share - target) / target, 4),
            }
    return {
        "run": "server",
        "model": "sim:a10g-llama-7b",
        "duration_s": duration,
        "levels": levels,
        "worst_deviation": max(v["deviation"] for v in levels.values()),
        "light_ttft_p90_s": round(light, 4),
        "light_alone_ttft_p90_s": round(alone, 4),
        "light_ttft_ratio": round(light / alone, 3),
    }
