"""The server alone: `sim:zero` (no step time), so everything measured is tokenfair's own cost.

1. Short non-streaming requests (4 tokens) from 1, 64 and 512 closed-loop clients:
   requests/s and latency p50/p99. With a model that costs nothing, the latency is all
   the server's (HTTP, validation, admission, the engine thread hand-off, scheduling);
   at 64 and 512 clients it also holds the queueing any saturated server shows.
2. Streams paced like a GPU: `sim:fixed:0.01` (10 ms a step), 16 tokens each, 1, 64 and
   512 concurrent streams all running at once (--max-num-seqs 512). A stream ideally
   ends 16 steps after it starts; what the client measures beyond 16 x 10 ms is the
   latency the server adds (HTTP, SSE encoding, the per-step Python of scheduler and
   engine, waiting for the step in progress: at most one step).

Prints one JSON line per measurement (with the 1-minute load average: the machine is
shared, so compare runs under similar load).

    nice -n 10 .venv/bin/python benchmarks/server_alone.py [--requests 4000]
"""

from __future__ import annotations

import argparse

from server_tools.common import emit, run_load, tokenfair_server

STEP_S = 0.01
STREAM_TOKENS = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512])
    args = parser.parse_args()

    server = tokenfair_server("--model", "sim:zero", "--max-num-seqs", "1024")
    try:
        run_load(server.url, "sim:zero", "--concurrency", "16", "--requests", "500")  # warm up
        for concurrency in args.concurrency:
            result = run_load(
                server.url, "sim:zero", "--concurrency", str(concurrency),
                "--requests", str(max(args.requests, 4 * concurrency)), "--max-tokens", "4",
            )  # fmt: skip
            emit({"benchmark": "server_alone", "scenario": "short_non_streaming", **result})
    finally:
        server.stop()

    model = f"sim:fixed:{STEP_S}"
    server = tokenfair_server("--model", model, "--max-num-seqs", "1024")
    try:
        for concurrency in args.concurrency:
            result = run_load(
                server.url, model, "--concurrency", str(concurrency), "--stream",
                "--requests", str(4 * concurrency if concurrency > 1 else 100),
                "--max-tokens", str(STREAM_TOKENS),
            )  # fmt: skip
            ideal = STREAM_TOKENS * STEP_S
            added = {
                "added_p50_s": round(float(result["latency_p50_s"]) - ideal, 4),  # type: ignore[arg-type]
                "added_p99_s": round(float(result["latency_p99_s"]) - ideal, 4),  # type: ignore[arg-type]
                "ideal_latency_s": ideal,
            }
            emit({"benchmark": "server_alone", "scenario": "paced_streams", **result, **added})
    finally:
        server.stop()


if __name__ == "__main__":
    main()
