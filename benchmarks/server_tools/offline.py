"""tokenfair's engine offline (tokenfair.LLM, no server) on the throughput workload of
server_vs_vllm.py: 96 requests of 128 prompt tokens and 128 output tokens (EOS ignored),
16 sequences at most. Prints one JSON line with output tokens/s.

    python benchmarks/server_tools/offline.py MODEL_DIR
"""

from __future__ import annotations

import argparse
import json
import time

from tokenfair import LLM
from tokenfair.core.request import SamplingParams

PROMPT = " ".join(f"t{5 + i % 1000}" for i in range(128))


def main(model_dir: str, requests: int = 96) -> None:
    llm = LLM(model_dir, device="cpu", dtype="float32", kv_tokens=65536, max_num_seqs=16)
    sampling = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPT] * 4, SamplingParams(max_tokens=8, ignore_eos=True))  # warm up
    started = time.perf_counter()
    completions = llm.generate([PROMPT] * requests, sampling)
    tokens = sum(len(c.token_ids) for c in completions)
    elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "requests": requests,
                "elapsed_s": round(elapsed, 3),
                "output_tokens_per_s": round(tokens / elapsed, 1),
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    args = parser.parse_args()
    main(args.model_dir)
