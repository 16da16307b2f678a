"""The server alone: what tokenfair's HTTP server costs on top of its engine.

1. Short non-streaming requests (4 tokens) on `sim:zero` (no step time) from 1, 64 and
   512 closed-loop clients: requests/s and latency p50/p99. With a model that costs
   nothing, the latency is all the server's (HTTP, validation, admission, the engine
   thread hand-off, scheduling); at 64 and 512 clients the server is saturated, and the
   latency is the queueing any saturated server shows (clients / throughput).
2. Streams paced like a GPU: `sim:fixed:0.01` (10 ms a step), 1, 64 and 512 concurrent
   streams, each asking 8-24 tokens (mean 16) and starting at a different moment, as
   real traffic does (`--max-num-seqs 1024`: all run at once). For every request the
   client's end-to-end latency and TTFT are matched, by response id, with the engine's
   own record of the same request (`/admin/requests/recent`: from submission to the
   engine until its last token). "added" is the difference: what the server's HTTP
   layer adds (reading and validating the request, tokenizing, handing it to the engine
   thread, encoding and writing the chunks), the engine's time (steps, and the per-step
   Python of scheduler and engine, which an offline run pays too) excluded. The figure
   beyond the ideal (tokens x 10 ms, no engine overhead, no wait for the step in
   progress) is printed beside it.
3. The same streams in an open loop: Poisson arrivals at the rate that keeps 1, 64 and
   512 streams in flight on average (Little's law: streams / mean duration), as
   independent users arrive. A closed-loop client sends its next request the moment its
   stream ends, so all its arrivals land in the burst right after a step; these land
   anywhere in the step.

Prints one JSON line per measurement (with the 1-minute load average: the machine is
shared, so compare runs under similar load).

    .venv/bin/python benchmarks/server_alone.py [--requests 4000] [--engine process]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import yaml

from server_tools.common import OUT, emit, run_load, tokenfair_server
from server_tools.loadgen import pct as loadgen_pct
from tokenfair.edge.tenants import hash_key

STEP_S = 0.01
TOKENS = (8, 24)  # each stream asks for a uniform number of tokens in this range
ADMIN_KEY = "bench-admin"
KEY = "bench-key"


def tenants_file() -> Path:
    path = OUT / "tenants.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    tenants = [{"name": "bench", "key_sha256": [hash_key(KEY)], "max_waiting": 100_000}]
    path.write_text(yaml.safe_dump({"admin_key_sha256": hash_key(ADMIN_KEY), "tenants": tenants}))
    return path


def pct(values: list[float], q: int) -> float | None:
    value = loadgen_pct(values, q)
    return None if value is None else round(value, 5)


def added_by_server(url: str, ids_file: Path) -> dict[str, object]:
    """Client-measured minus engine-measured time, per request, matched by id."""
    engine = {
        row["id"]: row
        for row in httpx.get(
            f"{url}/admin/requests/recent",
            params={"limit": 2048},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        ).json()["data"]
    }
    e2e, ttft, ideal = [], [], []
    for line in ids_file.read_text().splitlines():
        client = json.loads(line)
        row = engine.get(client["id"])
        if row is None:
            continue
        e2e.append(client["latency_s"] - row["e2e_handed_over_s"])
        if client["ttft_s"] is not None and row["ttft_handed_over_s"] is not None:
            ttft.append(client["ttft_s"] - row["ttft_handed_over_s"])
        ideal.append(client["latency_s"] - row["completion_tokens"] * STEP_S)
    if len(e2e) < 2:
        return {"matched": len(e2e)}
    return {
        "matched": len(e2e),
        "added_p50_s": pct(e2e, 50),
        "added_p99_s": pct(e2e, 99),
        "added_ttft_p50_s": pct(ttft, 50),
        "added_ttft_p99_s": pct(ttft, 99),
        "beyond_ideal_p50_s": pct(ideal, 50),
        "beyond_ideal_p99_s": pct(ideal, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--skip-short", action="store_true")
    parser.add_argument(
        "--engine", choices=["auto", "process", "thread"], default="auto",
        help="tokenfair serve --engine (auto: a thread for sim:)",
    )  # fmt: skip
    args = parser.parse_args()
    engine = ("--engine", args.engine)

    if not args.skip_short:
        server = tokenfair_server("--model", "sim:zero", "--max-num-seqs", "1024", *engine)
        try:
            run_load(server.url, "sim:zero", "--concurrency", "16", "--requests", "500")  # warm up
            for concurrency in args.concurrency:
                result = run_load(
                    server.url, "sim:zero", "--concurrency", str(concurrency),
                    "--requests", str(max(args.requests, 4 * concurrency)), "--max-tokens", "4",
                )  # fmt: skip
                emit(
                    {
                        "benchmark": "server_alone",
                        "scenario": "short_non_streaming",
                        "engine": args.engine,
                        **result,
                    }
                )
        finally:
            server.stop()

    model = f"sim:fixed:{STEP_S}"
    server = tokenfair_server(
        "--model", model, "--max-num-seqs", "1024", "--tenants", str(tenants_file()), *engine
    )
    try:
        for concurrency in args.concurrency:
            ids = OUT / f"paced-{concurrency}.jsonl"
            result = run_load(
                server.url, model, "--concurrency", str(concurrency), "--stream",
                "--requests", str(max(1000, 4 * concurrency) if concurrency > 1 else 100),
                "--max-tokens-min", str(TOKENS[0]), "--max-tokens", str(TOKENS[1]),
                "--stagger", str(sum(TOKENS) / 2 * STEP_S), "--key", KEY,
                "--ids-out", str(ids),
            )  # fmt: skip
            added = added_by_server(server.url, ids)
            emit(
                {
                    "benchmark": "server_alone",
                    "scenario": "paced_streams",
                    "engine": args.engine,
                    **result,
                    **added,
                }
            )
            # The same mean number of streams in flight, arriving as independent users do.
            ids = OUT / f"paced-open-{concurrency}.jsonl"
            rate = concurrency / (sum(TOKENS) / 2 * STEP_S)  # Little's law
            result = run_load(
                server.url, model, "--rate", f"{rate:.3f}", "--stream",
                "--concurrency", str(4 * concurrency + 16),
                "--requests", str(max(1000, 4 * concurrency) if concurrency > 1 else 100),
                "--max-tokens-min", str(TOKENS[0]), "--max-tokens", str(TOKENS[1]),
                "--key", KEY, "--ids-out", str(ids),
            )  # fmt: skip
            emit(
                {
                    "benchmark": "server_alone",
                    "scenario": "paced_streams_open_loop",
                    "engine": args.engine,
                    "mean_streams": concurrency,
                    **result,
                    **added_by_server(server.url, ids),
                }
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
