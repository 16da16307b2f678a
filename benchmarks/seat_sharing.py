"""What seat sharing costs and gives on the flood, side by side in one run.

The flood of benchmarks/server_vs_vllm.py (same tiny random Llama, float32 on CPU, 16
seats): tenant A keeps 64 streams open (16-112 output tokens each, back to back) while
tenant B sends requests one at a time (8 tokens). Two `tokenfair serve` processes run
it in turn, one with `--share-seats` (the default) and one with `--no-share-seats`,
alternated over `--rounds` (order flipped each round). Figures per round and as
medians: B's TTFT p50/p90, A's output tokens/s over the same window (what preempting
A's newest request for B costs), and the preemptions the server counted.

A second scenario, `hold`: A sends two requests with `n` = 8 and 1,800 output tokens
each (about 9 s here), which take all 16 seats for their whole length; B's TTFT is
then how long a seat takes to come free (without sharing: the end of A's generations).

`--compare holdings` runs the same two scenarios with the server's defaults (KV memory
and the step shared among tenants too) against `--no-share-memory --step-share-tokens
0` (charges only): whether sharing what a tenant holds costs the flood anything.

    nice -n 10 .venv/bin/python benchmarks/seat_sharing.py [--rounds 3] [--compare holdings]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path

import httpx
import yaml

from server_tools.common import OUT, emit, loadgen, run_load, tokenfair_server
from server_tools.common import finish as finish_load
from server_vs_vllm import LIGHT_PROMPT, NAME, PROMPT, SEATS, build_model_dir
from tokenfair.edge.tenants import hash_key

ADMIN_KEY = "admin-key"
# What is compared: seats shared or kept (the default comparison), or what a tenant holds
# (KV memory and the step) shared, as the server does by default, or charged only.
COMPARISONS: dict[str, dict[str, tuple[str, ...]]] = {
    "seats": {"shared": ("--share-seats",), "kept": ("--no-share-seats",)},
    "holdings": {"shared": (), "kept": ("--no-share-memory", "--step-share-tokens", "0")},
}


def tenants_file(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "admin_key_sha256": hash_key(ADMIN_KEY),
                "tenants": [
                    {"name": "heavy", "key_sha256": [hash_key("heavy-key")], "max_waiting": 4096},
                    {"name": "light", "key_sha256": [hash_key("light-key")], "max_waiting": 4096},
                ],
            }
        )
    )
    return path


def preemptions(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tokenfair:num_preemptions_total{")
    )


def flood(url: str, seconds: float) -> dict[str, float]:
    before = preemptions(url)
    heavy = loadgen(
        url, NAME, "--concurrency", "64", "--requests", "1000000", "--duration", str(seconds),
        "--max-tokens", "112", "--max-tokens-min", "16", "--prompt", PROMPT, "--stream",
        "--ignore-eos", "--key", "heavy-key",
    )  # fmt: skip
    time.sleep(min(8.0, seconds / 4))  # A fills every seat and builds its backlog
    light = run_load(
        url, NAME, "--concurrency", "1", "--requests", "1000000",
        "--duration", str(seconds - min(8.0, seconds / 4) - 2), "--max-tokens", "8",
        "--prompt", LIGHT_PROMPT, "--stream", "--ignore-eos", "--key", "light-key",
    )  # fmt: skip
    heavy_result = finish_load(heavy)
    return {
        "light_requests": float(light["requests"]),  # type: ignore[arg-type]
        "light_ttft_p50_s": float(light["ttft_p50_s"]),  # type: ignore[arg-type]
        "light_ttft_p90_s": float(light["ttft_p90_s"]),  # type: ignore[arg-type]
        "heavy_output_tokens_per_s": float(heavy_result["output_tokens_per_s"]),  # type: ignore[arg-type]
        "preemptions": preemptions(url) - before,
    }


def hold(url: str) -> dict[str, float]:
    """A holds every seat with two n=8 requests; B's TTFT for one request."""
    body = {
        "model": NAME,
        "prompt": PROMPT,
        "n": SEATS // 2,
        "max_tokens": 1800,
        "ignore_eos": True,
    }
    holders = [
        one_request(url, body, "heavy-key"),
        one_request(url, body, "heavy-key"),
    ]
    time.sleep(1.5)  # both admitted and decoding
    light = run_load(
        url, NAME, "--concurrency", "1", "--requests", "3", "--max-tokens", "8",
        "--prompt", LIGHT_PROMPT, "--stream", "--ignore-eos", "--key", "light-key",
    )  # fmt: skip
    for holder in holders:
        holder.wait()
    return {
        "light_ttft_p50_s": float(light["ttft_p50_s"]),  # type: ignore[arg-type]
        "light_ttft_max_s": float(light["ttft_p99_s"]),  # type: ignore[arg-type]
    }


def one_request(url: str, body: dict[str, object], key: str):  # type: ignore[no-untyped-def]
    """One request in a child process of its own (its answer is not read here)."""
    import subprocess

    code = (
        "import httpx, json, sys; "
        f"httpx.post({url + '/v1/completions'!r}, json=json.loads(sys.argv[1]), "
        f"headers={{'Authorization': 'Bearer {key}'}}, timeout=600)"
    )
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(body)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=40.0, help="length of one flood")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="seats")
    args = parser.parse_args()
    modes = COMPARISONS[args.compare]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    model_dir = build_model_dir(OUT / "model")
    tenants = tenants_file(OUT / "seat-sharing-tenants.yaml")
    common = (
        "--model", str(model_dir), "--served-model-name", NAME, "--policy", "vtc",
        "--tenants", str(tenants), "--device", "cpu", "--dtype", "float32",
        "--kv-tokens", "65536", "--max-num-seqs", str(SEATS),
    )  # fmt: skip
    servers = {mode: tokenfair_server(*common, *flags) for mode, flags in modes.items()}
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    try:
        for url in (s.url for s in servers.values()):  # warm up
            run_load(url, NAME, "--concurrency", "4", "--requests", "8", "--max-tokens", "8")
        for round_ in range(args.rounds):
            order = list(modes) if round_ % 2 == 0 else list(modes)[::-1]
            for mode in order:
                figures = {**flood(servers[mode].url, args.seconds)}
                figures.update({f"hold_{k}": v for k, v in hold(servers[mode].url).items()})
                results[mode].append(figures)
                emit({"benchmark": "seat_sharing", "round": round_, "mode": mode, **figures})
        summary: dict[str, object] = {
            "benchmark": "seat_sharing",
            "compare": args.compare,
            "rounds": args.rounds,
        }
        for mode, runs in results.items():
            for key in runs[0]:
                summary[f"{mode}_{key}_median"] = round(statistics.median(r[key] for r in runs), 4)
        shared, kept = results["shared"], results["kept"]
        summary["heavy_tokens_per_s_shared_over_kept_median"] = round(
            statistics.median(
                s["heavy_output_tokens_per_s"] / k["heavy_output_tokens_per_s"]
                for s, k in zip(shared, kept, strict=True)
            ),
            3,
        )
        emit(summary)
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
