"""What one gateway adds to a single request at idle, and the gateway's CPU per request.

    nice -n 10 .venv/bin/python benchmarks/gateway_c1_probe.py [--baseline-src DIR]

One fake upstream (tests/gateway/fake_upstream.py, answering at once), the upstream
directly, one gateway process running this tree's src/, and optionally a second gateway
running another source tree (`--baseline-src`, e.g. an older commit unpacked with
`git archive`), so two versions are compared under the same machine load. One client
(concurrency 1, keep-alive) alternates the targets round by round: streaming chat
completions (time to the first token) and 1-token completions. The gateway's CPU per
request comes from /proc/<pid>/schedstat (CPU time actually run, insensitive to other
work on the machine, unlike wall-clock latency). Prints one JSON line per round and
target, and a summary of medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gateway_overhead import (  # noqa: E402
    KEY,
    _one_connection,
    _pct,
    _request,
    _start,
    _wait_http,
)


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def _probe(url: str, seconds: float) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    stream = _request(
        host,
        int(port),
        "/v1/chat/completions",
        {
            "model": "fake",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        },
    )
    short = _request(
        host, int(port), "/v1/completions", {"model": "fake", "prompt": "hi", "max_tokens": 1}
    )
    result: dict[str, float] = {}
    for name, request in (("stream", stream), ("short", short)):
        out: list[tuple[float, float, float, int, int]] = []
        await _one_connection(host, int(port), [(request, 4)], time.perf_counter() + 0.3, [])
        await _one_connection(host, int(port), [(request, 4)], time.perf_counter() + seconds, out)
        ok = [r for r in out if r[3] == 200]
        result[f"{name}_requests"] = len(ok)
        result[f"{name}_p50_ms"] = round(1000 * _pct([r[1] for r in ok], 0.5), 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="another tree's src/ to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    import yaml
    from tests.gateway.redis_server import free_port

    from tokenfair.edge.tenants import hash_key

    tmp = Path(tempfile.mkdtemp(prefix="gateway-probe-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        up_port = free_port()
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
        fake = [sys.executable, "-m", "tests.gateway.fake_upstream", "--port", str(up_port)]
        fake += ["--token-interval", "0"]
        procs.append(_start(fake, tmp / "upstream.log", env))
        _wait_http(f"http://127.0.0.1:{up_port}", "/health", 30)
        (tmp / "tenants.yaml").write_text(
            yaml.safe_dump({"tenants": [{"name": "bench", "key_sha256": [hash_key(KEY)]}]})
        )
        targets: dict[str, tuple[str, int | None]] = {
            "direct": (f"http://127.0.0.1:{up_port}", None)
        }
        trees = {"gateway": ROOT / "src"}
        if args.baseline_src is not None:
            trees["baseline"] = args.baseline_src.resolve()
        for name, src in trees.items():
            port = free_port()
            config = {
                "listen": {"port": port},
                "tenants": str(tmp / "tenants.yaml"),
                "upstreams": [
                    {"url": f"http://127.0.0.1:{up_port}", "models": ["fake"], "max_concurrent": 64}
                ],
            }
            (tmp / f"{name}.yaml").write_text(yaml.safe_dump(config))
            genv = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
            main_ = (
                "import typer; from tokenfair.commands.gateway import gateway; typer.run(gateway)"
            )
            cmd = [sys.executable, "-c", main_, "--config", str(tmp / f"{name}.yaml")]
            proc = _start(cmd, tmp / f"{name}.log", genv)
            procs.append(proc)
            _wait_http(f"http://127.0.0.1:{port}", "/health", 60)
            targets[name] = (f"http://127.0.0.1:{port}", proc.pid)
        runs: dict[str, list[dict[str, float]]] = {}
        names = list(targets)
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                url, pid = targets[name]
                cpu0 = _cpu_ns(pid) if pid else 0
                result = asyncio.run(_probe(url, args.seconds))
                if pid:
                    total = result["stream_requests"] + result["short_requests"]
                    result["gateway_cpu_us_per_request"] = round(
                        (_cpu_ns(pid) - cpu0) / 1000 / total, 1
                    )
                runs.setdefault(name, []).append(result)
                print(json.dumps({"target": name, "round": round_, **result}), flush=True)
        medians = {
            n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()
        }
        summary: dict[str, Any] = {"summary": True, "load_avg_1m": round(os.getloadavg()[0], 2)}
        for name in trees:
            m, d = medians[name], medians["direct"]
            summary[name] = {
                "added_ttft_p50_ms": round(m["stream_p50_ms"] - d["stream_p50_ms"], 3),
                "added_short_p50_ms": round(m["short_p50_ms"] - d["short_p50_ms"], 3),
                "gateway_cpu_us_per_request": m["gateway_cpu_us_per_request"],
            }
        print(json.dumps(summary), flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
