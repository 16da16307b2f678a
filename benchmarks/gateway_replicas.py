"""Fairness across gateway replicas sharing one Redis, side by side with another tree.

    .venv/bin/python benchmarks/gateway_replicas.py [--baseline-src OTHER_TREE/src]
        [--seconds 12] [--repeats 2]

Scenarios, each on real processes on loopback (the tests' fake OpenAI upstream, one
redis-server per scenario, gateways started from each tree's `src`):

- skewed ingress: two replicas in front of one upstream of 4 slots (10 ms a token,
  20 tokens a request), for `--seconds`. Tenant heavy (weight 4) reaches only the first replica, tenant
  light (weight 1) only the second; each keeps 16 streams open, so both are always
  backlogged. What each tenant is served (prompt + 2 x output tokens) from 2 s until
  the clients stop (what drains after that is not competition), and heavy's over light's: VTC's promise is 4.0 over a long
  window, its guarantee a bounded weighted gap (SPEC 3), printed with its bound. The
  gap swings by about one round of the upstream's slots (the replica whose claim is
  best takes every slot that frees), so a short window reads far from 4.0. The replicas can only get it by sharing the
  counters and the capacity through Redis.
- mixed ingress: the same, with heavy reaching both replicas (8 streams each) and light
  the second only; weights 1:1, so the promise is 1.0.
- flood: one replica with Redis in front of the same upstream (5 ms a token, 10 tokens),
  heavy keeping 64 streams open, light sending 20 requests one at a time: light's TTFT
  p50/p90 and how many requests the gateway dispatched ahead of each (its own record).

Prints one JSON line per tree and scenario, then a summary with each tree's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gateway.load import Done, closed_loop, percentile  # noqa: E402
from tests.gateway.processes import (  # noqa: E402
    ENV,
    GATEWAY_MAIN,
    Process,
    fake_upstream,
    tenants_file,
)
from tests.gateway.redis_server import RedisServer, free_port  # noqa: E402
from tests.gateway.test_fairness import _light_under_flood  # noqa: E402


def start_gateway(
    src: Path, tmp: Path, name: str, upstream: Process, tenants: Path, **settings: Any
) -> Process:
    port, metrics_port = free_port(), free_port()
    config = {
        "listen": {"port": port, "metrics_port": metrics_port},
        "tenants": str(tenants),
        "upstreams": [{"url": upstream.url, "models": ["fake"], "max_concurrent": 4}],
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "fail_after": 1},
        **settings,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    # The gateway from `src`; the fake upstream and the clients from this tree.
    env = {**ENV, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
    args = [sys.executable, "-c", GATEWAY_MAIN, "--config", str(path), "--log-level", "warning"]
    return Process(args, port, tmp / f"{name}.log", metrics_port, env).start()


def served(done: list[Done], since: float, until: float) -> dict[str, float]:
    """Service finished in [since, until): the clients stop sending at `until`, and
    what drains after it is no longer two backlogged tenants competing."""
    out: dict[str, float] = {}
    for d in done:
        if since <= d.finish < until:
            out[d.tenant] = out.get(d.tenant, 0.0) + d.service
    return out


def ingress(
    src: Path, tmp: Path, seconds: float, mixed: bool, replicas: int = 2, depth: int = 4
) -> dict[str, Any]:
    """`depth`: each tenant's streams over the upstream's 4 slots (2: 8 streams)."""
    redis = RedisServer(tmp)
    redis.start()
    upstream = fake_upstream(tmp, "u-ingress", token_interval=0.01)
    tenants = tenants_file(tmp, None if mixed else {"heavy": 4.0})
    gws = [
        start_gateway(
            src,
            tmp,
            f"g{i}",
            upstream,
            tenants,
            redis={"url": redis.url, "namespace": "bench"},
            gateway_id=f"g{i}",
        )
        for i in range(replicas)
    ]
    streams = 4 * depth
    # Skewed: heavy reaches the first half of the replicas, light the others; mixed:
    # heavy reaches every replica, light the last one.
    heavy_at = gws if mixed else gws[: replicas // 2]
    light_at = gws[-1:] if mixed else gws[replicas // 2 :]

    async def run() -> list[Done]:
        t0 = time.perf_counter()
        done: list[Done] = []
        until = t0 + seconds
        loops = [
            closed_loop(g.url, tenant, streams // len(at), 20, until, t0, done)
            for tenant, at in (("heavy", heavy_at), ("light", light_at))
            for g in at
        ]
        await asyncio.gather(*loops)
        return done

    try:
        time.sleep(1.0)  # settled: the replicas' first syncs are behind them
        idle_start, idle_cpu_start = redis_commands(redis.url), redis_cpu_s(redis.url)
        time.sleep(IDLE_S)
        idle = (redis_commands(redis.url) - idle_start) / IDLE_S
        idle_cpu = (redis_cpu_s(redis.url) - idle_cpu_start) / IDLE_S
        before, cpu_before = redis_commands(redis.url), redis_cpu_s(redis.url)
        scripts_before, script_us_before = redis_scripts_run(redis.url)
        load_began = time.perf_counter()
        done = asyncio.run(run())
        load_s = time.perf_counter() - load_began
        commands = redis_commands(redis.url) - before
        cpu = redis_cpu_s(redis.url) - cpu_before
        scripts, script_us = redis_scripts_run(redis.url)
        scripts, script_us = scripts - scripts_before, script_us - script_us_before
        peak = httpx.get(upstream.url + "/stats", timeout=5).json()["peak_running"]
    finally:
        for g in gws:
            g.stop()
        upstream.stop()
        redis.stop()
    service = served(done, 2.0, seconds)
    heavy, light = service.get("heavy", 0.0), service.get("light", 0.0)
    weight = 1.0 if mixed else 4.0
    promise = 1.0 if mixed else 4.0
    # SPEC 3's bound on the weighted gap, |W_heavy - W_light| <= 2 max(w_in L_in,
    # w_out M), M the tokens the upstream's 4 slots hold (prompt 3 + 20 output each),
    # plus one request's service for the window's edges.
    bound = 2 * max(3, 2 * 4 * 23) + (3 + 2 * 20)
    ratio = heavy / max(light, 1.0)
    return {
        "replicas": replicas,
        "streams_per_tenant": streams,
        "served": service,
        "heavy_over_light": round(ratio, 3),
        "off_the_weights": round(abs(ratio / promise - 1.0), 3),
        "weighted_gap": round(abs(heavy / weight - light), 1),
        "gap_bound": bound,
        "promise": promise,
        "upstream_peak_running": peak,
        "requests": len(done),
        "redis_idle_commands_per_s_per_replica": round(idle / replicas, 1),
        "redis_commands_per_request_beyond_idle": round(
            max(0.0, commands - idle * load_s) / max(len(done), 1), 2
        ),
        "redis_scripts_per_request": round(scripts / max(len(done), 1), 2),
        # Redis's own time in the scripts (commandstats), per script and per request.
        "redis_us_per_script": round(script_us / max(scripts, 1), 1),
        "redis_script_us_per_request": round(script_us / max(len(done), 1), 1),
        # Redis's CPU (user + system): an idle replica's, per second, and a request's
        # beyond the idle rate.
        "redis_cpu_idle_ms_per_s_per_replica": round(1000 * idle_cpu / replicas, 3),
        "redis_cpu_us_per_request_beyond_idle": round(
            1e6 * max(0.0, cpu - idle_cpu * load_s) / max(len(done), 1), 1
        ),
    }


IDLE_S = 4.0


def redis_commands(url: str) -> int:
    """Every command Redis ran, those inside scripts included (INFO commandstats)."""
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    # The INFO calls of this benchmark are not the gateways'.
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def redis_cpu_s(url: str) -> float:
    """The CPU time Redis has used, user and system (INFO cpu)."""
    import redis

    info = redis.Redis.from_url(url).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_scripts_run(url: str) -> tuple[int, float]:
    """Lua scripts Redis ran (counter merges, lease syncs), and the microseconds they
    took in all, their commands included (INFO commandstats)."""
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    scripts = [v for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")]
    return sum(int(v["calls"]) for v in scripts), sum(float(v["usec"]) for v in scripts)


def freeze(src: Path, tmp: Path, seconds: float = 10.0) -> dict[str, Any]:
    """Redis frozen (SIGSTOP) for `seconds` under load: two replicas in front of one
    upstream of 4 slots, tenant a at the first and b at the second (weights 1:1), 8
    streams each. Per tenant, the longest time without a first token going out while
    Redis is frozen (the dispatch gap), the longest time to first token of a request
    sent then, and the upstream's peak of running requests (its capacity is 4)."""
    redis = RedisServer(tmp)
    redis.start()
    upstream = fake_upstream(tmp, "u-freeze", token_interval=0.01)
    tenants = tenants_file(tmp, None)
    gws = [
        start_gateway(
            src,
            tmp,
            f"f{i}",
            upstream,
            tenants,
            redis={"url": redis.url, "namespace": "freeze"},
            gateway_id=f"f{i}",
        )
        for i in range(2)
    ]
    before, after = 3.0, 3.0
    assert redis.process is not None
    pid = redis.process.pid

    async def run() -> list[Done]:
        t0 = time.perf_counter()
        done: list[Done] = []
        loop = asyncio.get_running_loop()
        loop.call_later(before, os.kill, pid, signal.SIGSTOP)
        loop.call_later(before + seconds, os.kill, pid, signal.SIGCONT)
        until = t0 + before + seconds + after
        await asyncio.gather(
            closed_loop(gws[0].url, "heavy", 8, 20, until, t0, done),
            closed_loop(gws[1].url, "light", 8, 20, until, t0, done),
        )
        return done

    try:
        done = asyncio.run(run())
        peak = httpx.get(upstream.url + "/stats", timeout=5).json()["peak_running"]
    finally:
        os.kill(pid, signal.SIGCONT)
        for g in gws:
            g.stop()
        upstream.stop()
        redis.stop()
    frozen_from, frozen_to = before, before + seconds
    result: dict[str, Any] = {"frozen_s": seconds, "upstream_peak_running": peak}
    for tenant in ("heavy", "light"):
        firsts = sorted(d.start + d.first for d in done if d.tenant == tenant)
        inside = [t for t in firsts if frozen_from <= t <= frozen_to]
        edges = [frozen_from, *inside, frozen_to]
        result[f"{tenant}_longest_gap_s"] = round(
            max(b - a for a, b in itertools.pairwise(edges)), 3
        )
        result[f"{tenant}_first_tokens_while_frozen"] = len(inside)
        result[f"{tenant}_ttft_max_s"] = round(
            max(
                (
                    d.first
                    for d in done
                    if d.tenant == tenant and frozen_from <= d.start <= frozen_to
                ),
                default=0.0,
            ),
            3,
        )
    return result


def flood(src: Path, tmp: Path, light_requests: int = 20) -> dict[str, Any]:
    redis = RedisServer(tmp)
    redis.start()
    upstream = fake_upstream(tmp, "u-flood", token_interval=0.005)
    gw = start_gateway(
        src,
        tmp,
        "flood",
        upstream,
        tenants_file(tmp),
        redis={"url": redis.url, "namespace": "flood"},
        gateway_id="flood",
    )
    try:
        ttfts, dispatched_ahead = _light_under_flood(gw, 64, light_requests)
    finally:
        gw.stop()
        upstream.stop()
        redis.stop()
    ahead = [float(a) for a in dispatched_ahead]
    return {
        "light_ttft_p50_s": round(statistics.median(ttfts), 4),
        "light_ttft_p90_s": round(percentile(ttfts, 0.9), 4),
        "light_dispatched_ahead_p90": percentile(ahead, 0.9),
    }


def _summary(f: dict[str, list[Any]], cells: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        cell: {
            "heavy_over_light": [r["heavy_over_light"] for r in f[cell]],
            "off_the_weights": [r["off_the_weights"] for r in f[cell]],
            "commands_per_request": [r["redis_commands_per_request_beyond_idle"] for r in f[cell]],
            "redis_cpu_us_per_request": [
                r["redis_cpu_us_per_request_beyond_idle"] for r in f[cell]
            ],
            "redis_us_per_script": [r["redis_us_per_script"] for r in f[cell]],
        }
        for cell in cells
    }
    ingress = [r for cell in cells for r in f[cell]]
    if ingress:
        out["redis_idle_commands_per_s_per_replica"] = max(
            r["redis_idle_commands_per_s_per_replica"] for r in ingress
        )
        out["upstream_peak_running"] = max(r["upstream_peak_running"] for r in ingress)
    if "flood" in f:
        out["flood_light_ttft_p90_s"] = [r["light_ttft_p90_s"] for r in f["flood"]]
        out["flood_light_dispatched_ahead_p90"] = [
            r["light_dispatched_ahead_p90"] for r in f["flood"]
        ]
    if "freeze" in f:
        out["freeze_longest_gap_s"] = [
            max(r["heavy_longest_gap_s"], r["light_longest_gap_s"]) for r in f["freeze"]
        ]
        out["freeze_upstream_peak_running"] = [r["upstream_peak_running"] for r in f["freeze"]]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="another tree's src, run alongside")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--only", help="comma-separated scenarios: skewed, mixed, flood, freeze (default: all)"
    )
    args = parser.parse_args()
    trees = {"this": ROOT / "src"}
    if args.baseline_src:
        trees["baseline"] = args.baseline_src.resolve()
    figures: dict[str, dict[str, list[Any]]] = {name: {} for name in trees}
    only = set(args.only.split(",")) if args.only else {"skewed", "mixed", "flood", "freeze"}
    cells = [
        (f"{kind}_{replicas}x{depth}", kind == "mixed", replicas, depth)
        for kind in ("skewed", "mixed")
        if kind in only
        for replicas in (2, 4)
        for depth in (2, 4)
    ]
    for repeat in range(args.repeats):
        for name, src in trees.items():  # interleaved: the machine's noise hits both
            with tempfile.TemporaryDirectory() as tmp:
                here = Path(tmp)
                results: list[tuple[str, dict[str, Any]]] = [
                    (cell, ingress(src, here, args.seconds, mixed, replicas, depth))
                    for cell, mixed, replicas, depth in cells
                ]
                if "flood" in only:
                    results.append(("flood", flood(src, here)))
                if "freeze" in only:
                    results.append(("freeze", freeze(src, here)))
                for scenario, result in results:
                    print(json.dumps({"tree": name, "repeat": repeat, scenario: result}))
                    figures[name].setdefault(scenario, []).append(result)
    summary = {name: _summary(f, [cell for cell, *_ in cells]) for name, f in figures.items()}
    print(json.dumps({"summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
