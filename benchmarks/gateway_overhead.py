"""What the gateway costs: added latency and max requests/s, against the upstream alone
and against LiteLLM's proxy in front of the same upstream, in one run.

    nice -n 10 .venv/bin/python benchmarks/gateway_overhead.py [--litellm /tmp/litellm-venv]
        [--baseline-src OTHER_TREE/src] [--prompt-bytes 4096]

Upstreams: the tests' fake OpenAI server (raw ASGI, never the bottleneck), one answering
at once ("short": non-streaming, 1 token) and one streaming 32 tokens 20 ms apart
("stream", a GPU-like decode pace). The load generator is this file run with `--load`
in a separate process: a minimal keep-alive HTTP/1.1 client on raw asyncio streams, so
the client costs as little as possible. Scenarios:

- streams: 64 concurrent streaming chat completions in closed loops; TTFT and end-to-end
  p50/p99; "added" is the target's minus the upstream's own;
- short: 64 concurrent closed loops of 1-token non-streaming completions; requests/s.

Targets: the upstream directly, one tokenfair gateway process (vtc, in-memory
counters) routing by prefix affinity (the default) and one routing least-loaded, one
with counters (and upstream capacity leases) in Redis, routing least-loaded so that its
figures differ from the second's by Redis alone, and LiteLLM's proxy with two workers
when its environment exists (`pip install 'litellm[proxy]'` into a separate venv). With
`--baseline-src`, the same gateways (least-loaded, and with Redis) from another tree,
and that tree's gateway once more in a second process ("baseline twin"): the twin's
figures over the baseline's show how far two identical targets differ in the run, the
resolution of this tree's comparison with the baseline. With `--plain-engine`, one more
gateway with Redis whose upstreams are `engine: openai`: what telling the upstream the
tenant (the default engine's `cache_salt` and `vllm_xargs` in every body) costs.
Each model is served by two upstream servers, so that routing has a choice to make. `--prompt-bytes N` gives every request a system prompt of N bytes, one
per connection (a conversation repeating its prefix, as routing by prefix expects).
Prints one JSON line per measurement and a summary line: the prefix-affinity gateway's
figures over the least-loaded one's, this tree's over the baseline's, and how many
times each gateway lost Redis during the run (its figures are then partly those of
local counters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = "key-light"
STREAM_TOKEN_S = 0.02  # the streaming upstream's pace, a GPU-like decode step


# --- the load generator (runs in its own process) ---
async def _one_connection(
    host: str,
    port: int,
    requests: list[tuple[bytes, int]],
    until: float,
    out: list[tuple[float, float, float, int, int]],
    start_after: float = 0.0,
) -> None:
    """One keep-alive connection in a closed loop, cycling through `requests`
    (each with the tokens it asks for)."""
    await asyncio.sleep(start_after)
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    try:
        while time.perf_counter() < until:
            request, tokens = requests[sent % len(requests)]
            sent += 1
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            lower = head.lower()
            first = 0.0
            close = b"connection: close" in lower
            if b"transfer-encoding: chunked" in lower:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    data = await reader.readexactly(size + 2)
                    if not first and b'"choices":[{' in data.replace(b" ", b""):
                        first = time.perf_counter()
            else:
                at = lower.index(b"content-length:") + len(b"content-length:")
                length = int(lower[at : lower.index(b"\r\n", at)])
                await reader.readexactly(length)
            end = time.perf_counter()
            out.append((start, (first or end) - start, end - start, status, tokens))
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    finally:
        writer.close()


def _request(host: str, port: int, path: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _system(connection: int, size: int) -> list[dict[str, str]]:
    """A system prompt of `size` bytes, one per connection (none for 0)."""
    if size <= 0:
        return []
    text = f"Conversation {connection}. " + "You are a careful assistant. " * (size // 29 + 1)
    return [{"role": "system", "content": text[:size]}]


async def _load(
    url: str, scenario: str, concurrency: int, seconds: float, warmup: float, prompt_bytes: int
) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    rng = random.Random(0)

    def stream_request(max_tokens: int, connection: int) -> tuple[bytes, int]:
        body = {
            "model": "stream",
            "messages": [*_system(connection, prompt_bytes), {"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        return _request(host, int(port), "/v1/chat/completions", body), max_tokens

    starts = [0.0] * concurrency
    if scenario == "streams":
        # Like real traffic, streams differ in length (16-48 tokens, mean 32) and start
        # at different moments, so arrivals spread over time.
        plans = [
            [stream_request(rng.randint(16, 48), c) for _ in range(64)] for c in range(concurrency)
        ]
        starts = [rng.uniform(0, 32 * STREAM_TOKEN_S) for _ in range(concurrency)]
    elif scenario == "lockstep":
        # Every stream 32 tokens, all started together: 64 requests reach the target in
        # the same instant, every 32 tokens (a burst, the worst case for a queue).
        plans = [[stream_request(32, c)] for c in range(concurrency)]
    else:
        plans = []
        for c in range(concurrency):
            system = _system(c, prompt_bytes)
            prompt = (system[0]["content"] if system else "") + "hi"
            body = {"model": "short", "prompt": prompt, "max_tokens": 1}
            plans.append([(_request(host, int(port), "/v1/completions", body), 0)])
    out: list[tuple[float, float, float, int, int]] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            _one_connection(host, int(port), plan, t0 + warmup + seconds, out, start)
            for plan, start in zip(plans, starts, strict=True)
        )
    )
    kept = [r for r in out if r[0] >= t0 + warmup]
    ok = [r for r in kept if r[3] == 200]
    span = max(r[0] + r[2] for r in kept) - (t0 + warmup) if kept else seconds
    return {
        "requests": len(kept),
        "errors": len(kept) - len(ok),
        "requests_per_s": round(len(ok) / span, 1),
        "ttft_p50_ms": round(1000 * _pct([r[1] for r in ok], 0.5), 2),
        "ttft_p99_ms": round(1000 * _pct([r[1] for r in ok], 0.99), 2),
        "e2e_p50_ms": round(1000 * _pct([r[2] for r in ok], 0.5), 2),
        "e2e_p99_ms": round(1000 * _pct([r[2] for r in ok], 0.99), 2),
        # End to end beyond the upstream's own pace (tokens x interval), per request: the
        # like-for-like figure when stream lengths differ.
        "excess_p50_ms": round(1000 * _pct([r[2] - r[4] * STREAM_TOKEN_S for r in ok], 0.5), 2),
        "excess_p99_ms": round(1000 * _pct([r[2] - r[4] * STREAM_TOKEN_S for r in ok], 0.99), 2),
    }


# --- the run ---
def _measure(
    url: str, scenario: str, concurrency: int, seconds: float, prompt_bytes: int
) -> dict[str, Any]:
    args = [
        sys.executable,
        __file__,
        "--load",
        url,
        "--scenario",
        scenario,
        "--concurrency",
        str(concurrency),
        "--seconds",
        str(seconds),
        "--prompt-bytes",
        str(prompt_bytes),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        return {
            "error": done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else f"exit {done.returncode}"
        }
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _wait_http(url: str, path: str, timeout: float, headers: dict[str, str] | None = None) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2, headers=headers).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return False


def _start(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", default="short", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--litellm", default="/tmp/litellm-venv", help="virtual env with litellm[proxy]"
    )
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument(
        "--plain-engine",
        action="store_true",
        help="also a Redis gateway whose upstreams are told nothing of the tenant",
    )
    parser.add_argument(
        "--prompt-bytes", type=int, default=0, help="a system prompt of this size per connection"
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also run a gateway from another tree's src/ (an older commit), in the same rounds",
    )
    args = parser.parse_args()
    if args.load:
        import uvloop

        print(
            json.dumps(
                uvloop.run(
                    _load(
                        args.load,
                        args.scenario,
                        args.concurrency,
                        args.seconds,
                        warmup=1.0,
                        prompt_bytes=args.prompt_bytes,
                    )
                )
            )
        )
        return

    import yaml
    from tests.gateway.processes import Process, fake_upstream
    from tests.gateway.redis_server import REDIS_SERVER, RedisServer, free_port

    from tokenfair.edge.tenants import hash_key

    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    procs: list[subprocess.Popen[bytes]] = []
    upstream_procs: list[Process] = []
    redis_server = None
    results: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        # Two servers of each model: routing has a choice to make (one engine may not
        # be listed twice, its capacity would count twice).
        ports, twins = {}, {}
        for name, interval in (("short", 0.0), ("stream", STREAM_TOKEN_S)):
            for copy, ports_of in enumerate((ports, twins)):
                upstream_procs.append(fake_upstream(tmp, f"{name}-{copy}", interval))
                ports_of[name] = upstream_procs[-1].port
        targets = {
            "direct": {
                "short": f"http://127.0.0.1:{ports['short']}",
                "stream": f"http://127.0.0.1:{ports['stream']}",
            }
        }
        (tmp / "tenants.yaml").write_text(
            yaml.safe_dump(
                {
                    "tenants": [
                        {"name": "bench", "key_sha256": [hash_key(KEY)], "max_waiting": 100000}
                    ]
                }
            )
        )
        upstreams = [
            {
                "url": f"http://127.0.0.1:{p}",
                "models": [m],
                "max_concurrent": 100000,
                "name": f"{m}-{copy}",
            }
            for m in ports
            for copy, p in enumerate((ports[m], twins[m]))
        ]
        gateways: dict[str, dict[str, Any]] = {
            "tokenfair": {"routing": "prefix-affinity"},
            "tokenfair least-loaded": {"routing": "least-loaded"},
        }
        if not args.skip_redis and os.path.exists(REDIS_SERVER):
            redis_server = RedisServer(tmp)
            redis_server.start()
            gateways["tokenfair+redis"] = {
                "redis": {"url": redis_server.url, "namespace": "bench"},
                "routing": "least-loaded",  # the counters' cost alone, as the baseline's
            }
            if args.plain_engine:
                # The same, telling the upstream nothing of the tenant: what the default
                # engine's per-tenant body rewrite (cache_salt, vllm_xargs) costs.
                plain = [{**u, "engine": "openai"} for u in upstreams]
                gateways["tokenfair+redis plain"] = {
                    "redis": {"url": redis_server.url, "namespace": "bench-plain"},
                    "routing": "least-loaded",
                    "upstreams": plain,
                }
        if args.baseline_src is not None:
            gateways["baseline"] = {}
            # The same gateway again in a second process: how far two identical targets
            # differ in this run, the resolution of every comparison in it.
            gateways["baseline twin"] = {}
            if redis_server is not None:
                redis = {"url": redis_server.url, "namespace": "bench-baseline"}
                gateways["baseline+redis"] = {"redis": redis}
        for name, extra in gateways.items():
            port = free_port()
            config = {
                "listen": {"port": port},
                "tenants": str(tmp / "tenants.yaml"),
                "upstreams": upstreams,
                "policy": "vtc",
                **extra,
            }
            (tmp / f"{name}.yaml").write_text(yaml.safe_dump(config))
            procs.append(
                _start(
                    [
                        sys.executable,
                        "-c",
                        "import typer; from tokenfair.commands.gateway import gateway; typer.run(gateway)",
                        "--config",
                        str(tmp / f"{name}.yaml"),
                    ],
                    tmp / f"{name}.log",
                    {**env, "PYTHONPATH": f"{args.baseline_src.resolve()}{os.pathsep}{ROOT}"}
                    if name.startswith("baseline")
                    else env,
                )
            )
            _wait_http(f"http://127.0.0.1:{port}", "/health", 30)
            targets[name] = {
                "short": f"http://127.0.0.1:{port}",
                "stream": f"http://127.0.0.1:{port}",
            }
        litellm = Path(args.litellm) / "bin" / "litellm"
        litellm_note = None
        if litellm.exists():
            port = free_port()
            models = [
                {
                    "model_name": m,
                    "litellm_params": {
                        "model": f"openai/{m}",
                        "api_base": f"http://127.0.0.1:{p}/v1",
                        "api_key": "none",
                    },
                }
                for m, p in ports.items()
            ]
            (tmp / "litellm.yaml").write_text(
                yaml.safe_dump({"model_list": models, "general_settings": {"master_key": KEY}})
            )
            lenv = {
                **os.environ,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_LOG": "ERROR",
                "LITELLM_TELEMETRY": "False",
            }
            procs.append(
                _start(
                    [
                        str(litellm),
                        "--config",
                        str(tmp / "litellm.yaml"),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--num_workers",
                        "2",
                    ],
                    tmp / "litellm.log",
                    lenv,
                )
            )
            if _wait_http(f"http://127.0.0.1:{port}", "/health/liveliness", 420):
                targets["litellm(2 workers)"] = {
                    "short": f"http://127.0.0.1:{port}",
                    "stream": f"http://127.0.0.1:{port}",
                }
            else:
                litellm_note = f"LiteLLM did not answer within 420 s: {(tmp / 'litellm.log').read_text()[-400:]}"
        else:
            litellm_note = f"LiteLLM not installed at {args.litellm} (pip install 'litellm[proxy]' into that venv)"
        # Rounds alternate the targets, order flipped each round; the summary takes the
        # median of the rounds, so a burst of other work on the machine moves one round.
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        names = list(targets)
        for round_ in range(args.rounds):
            for target in names if round_ % 2 == 0 else names[::-1]:
                for scenario in ("streams", "lockstep", "short"):
                    url = targets[target]["short" if scenario == "short" else "stream"]
                    result = _measure(
                        url, scenario, args.concurrency, args.seconds, args.prompt_bytes
                    )
                    runs.setdefault((target, scenario), []).append(result)
                    line = {"target": target, "scenario": scenario, "round": round_}
                    print(
                        json.dumps({**line, "concurrency": args.concurrency, **result}), flush=True
                    )
        for key, rounds in runs.items():
            failed = [r for r in rounds if "error" in r]
            results[key] = (
                failed[0]
                if failed
                else {field: statistics.median(r[field] for r in rounds) for field in rounds[0]}
            )
        summary: dict[str, Any] = {
            "summary": True,
            "cpus": os.cpu_count(),
            "rounds": args.rounds,
            "prompt_bytes": args.prompt_bytes,
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        direct = results[("direct", "streams")]
        burst = results[("direct", "lockstep")]
        for target in targets:
            if target == "direct":
                continue
            s, b, r = (results[(target, name)] for name in ("streams", "lockstep", "short"))
            if "error" in s or "error" in b or "error" in r:
                summary[target] = {"error": s.get("error") or b.get("error") or r.get("error")}
                continue
            summary[target] = {
                "added_ttft_p50_ms": round(s["ttft_p50_ms"] - direct["ttft_p50_ms"], 2),
                "added_ttft_p99_ms": round(s["ttft_p99_ms"] - direct["ttft_p99_ms"], 2),
                "added_e2e_p50_ms": round(s["excess_p50_ms"] - direct["excess_p50_ms"], 2),
                "added_e2e_p99_ms": round(s["excess_p99_ms"] - direct["excess_p99_ms"], 2),
                "lockstep_added_ttft_p50_ms": round(b["ttft_p50_ms"] - burst["ttft_p50_ms"], 2),
                "lockstep_added_e2e_p50_ms": round(b["e2e_p50_ms"] - burst["e2e_p50_ms"], 2),
                "short_requests_per_s": r["requests_per_s"],
            }
        summary["direct_short_requests_per_s"] = results[("direct", "short")].get("requests_per_s")
        affine, least = summary.get("tokenfair"), summary.get("tokenfair least-loaded")
        if isinstance(affine, dict) and isinstance(least, dict) and "error" not in affine:
            # Prefix-affinity's figures over least-loaded's, measured in the same rounds.
            summary["prefix_affinity_over_least_loaded"] = {
                field: round(affine[field] / least[field], 3) if least[field] else None
                for field in (
                    "added_ttft_p50_ms",
                    "added_ttft_p99_ms",
                    "lockstep_added_ttft_p50_ms",
                    "short_requests_per_s",
                )
                if field in least
            }
        lite = summary.get("litellm(2 workers)")
        if isinstance(lite, dict) and "short_requests_per_s" in lite and "tokenfair" in summary:
            summary["tokenfair_vs_litellm_requests_per_s"] = round(
                summary["tokenfair"]["short_requests_per_s"] / lite["short_requests_per_s"], 1
            )
        # A gateway that lost Redis during the run served on local counters: its figures
        # are not those of shared counters (an older tree's pool of 64 connections
        # failed under 64 concurrent requests, and then skipped Redis).
        outages = {
            name: (tmp / f"{name}.log").read_text(errors="replace").count("is unreachable")
            for name in gateways
            if "redis" in gateways[name]
        }
        summary["redis_outages_during_run"] = outages
        if args.baseline_src is not None:
            # This tree over the baseline tree, like for like (least-loaded routing, the
            # baseline's only one), measured in the same rounds.
            pairs = {
                "tokenfair least-loaded": "baseline",
                "tokenfair+redis": "baseline+redis",
                "baseline twin": "baseline",
            }
            summary["over_baseline"] = {
                mine: {
                    field: round(summary[mine][field] / summary[theirs][field], 3)
                    if summary[theirs][field]
                    else None
                    for field in ("added_ttft_p50_ms", "short_requests_per_s")
                }
                for mine, theirs in pairs.items()
                if "error" not in summary.get(mine, {"error": 1})
                and "error" not in summary.get(theirs, {"error": 1})
            }
        if litellm_note:
            summary["litellm_note"] = litellm_note
        print(json.dumps(summary), flush=True)
    finally:
        for fake in upstream_procs:
            fake.stop()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if redis_server is not None:
            redis_server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
