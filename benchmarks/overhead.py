"""Share of engine step time spent outside the model forward, for builtin:tiny.

At batch 1, 8 and 32 (decode steps, 64-token prompts, 128 output tokens), each engine
step's wall time is split into the model's forward call (transformers layers plus our
paged attention and KV writes, as timed by HFExecutor) and everything else: scheduling,
building the packed step, sampling, detokenizing, bookkeeping. Prints one JSON line.

    .venv/bin/python benchmarks/overhead.py [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tokenfair.core.request import Request, SamplingParams
from tokenfair.engine.hf.factory import make_hf_engine
from tokenfair.engine.hf.loader import load_model


def measure(batch: int, prompt_len: int, output: int, loaded) -> dict[str, float]:
    engine = make_hf_engine(
        loaded, kv_tokens=batch * (prompt_len + output) + 256, max_num_seqs=batch
    )
    executor = engine.executor
    g = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(0, 256, (prompt_len,), generator=g).tolist()
        sampling = SamplingParams(max_tokens=output, ignore_eos=True)
        engine.add_request(
            Request(f"r{i}", "c", prompt_len, 0.0, sampling, prompt_token_ids=prompt)
        )
    engine.step()  # the prefill step; only decode steps are measured
    step_s = forward_s = 0.0
    steps = 0
    while engine.has_unfinished():
        began = time.perf_counter()
        engine.step()
        step_s += time.perf_counter() - began
        forward_s += executor.last_forward_s
        steps += 1
    return {
        "step_ms": round(1000 * step_s / steps, 3),
        "forward_ms": round(1000 * forward_s / steps, 3),
        "overhead_share": round(1 - forward_s / step_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=3, help="best (lowest overhead) of N runs")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model("builtin:tiny", device="cpu")
    measure(4, 16, 8, loaded)  # warm-up
    figures = {}
    for batch in (1, 8, 32):
        runs = [measure(batch, 64, 128, loaded) for _ in range(args.repeats)]
        figures[f"batch_{batch}"] = min(runs, key=lambda r: r["overhead_share"])
    print(
        json.dumps(
            {
                "benchmark": "overhead",
                "model": "builtin:tiny",
                "threads": torch.get_num_threads(),
                **figures,
                "target_share_at_32": 0.10,
            }
        )
    )


if __name__ == "__main__":
    main()
