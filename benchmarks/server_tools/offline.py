"""tokenfair's engine offline (tokenfair.LLM, no server) on the throughput workload of
server_vs_vllm.py: 96 requests of 128 prompt tokens and 128 output tokens (EOS ignored),
16 sequences at most. Prints one JSON line with output tokens/s.

--through-thread runs the same engine on the server's engine thread (`AsyncEngine`), fed
and drained by an asyncio loop in the same process, without HTTP: what the server's
hand-off between its event loop and the engine costs on its own.

    python benchmarks/server_tools/offline.py MODEL_DIR [--through-thread]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from tokenfair import LLM
from tokenfair.core.request import SamplingParams
from tokenfair.engine.async_engine import AsyncEngine

PROMPT = " ".join(f"t{5 + i % 1000}" for i in range(128))


async def through_thread(llm: LLM, sampling: SamplingParams, requests: int) -> int:
    engine = AsyncEngine(llm.engine)
    engine.start()
    streams = [engine.submit(llm._request(PROMPT, sampling)) for _ in range(requests)]

    async def drain(stream) -> int:  # type: ignore[no-untyped-def]
        return sum([len(output.new_token_ids) async for output in stream])

    tokens = sum(await asyncio.gather(*(drain(s) for s in streams)))
    await engine.stop()
    return tokens


def main(model_dir: str, thread: bool, requests: int = 96) -> None:
    llm = LLM(model_dir, device="cpu", dtype="float32", kv_tokens=65536, max_num_seqs=16)
    sampling = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPT] * 4, SamplingParams(max_tokens=8, ignore_eos=True))  # warm up
    started = time.perf_counter()
    if thread:
        tokens = asyncio.run(through_thread(llm, sampling, requests))
    else:
        completions = llm.generate([PROMPT] * requests, sampling)
        tokens = sum(len(c.token_ids) for c in completions)
    elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "requests": requests,
                "through_thread": thread,
                "elapsed_s": round(elapsed, 3),
                "output_tokens_per_s": round(tokens / elapsed, 1),
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--through-thread", action="store_true")
    args = parser.parse_args()
    main(args.model_dir, args.through_thread)
