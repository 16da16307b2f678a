"""Throughput on CPU: tokenfair's engine vs transformers' generate (static batching) and
transformers' generate_batch (its continuous batching), same model, same workload.

Workload: N prompts of mixed lengths (uniform 16..512 tokens), each generating exactly
`--output` tokens greedily (EOS off, so every method does the same work). Figures are
generated tokens per second of wall time, warm-up excluded; each method runs
`--repeats` times, interleaved with the others, and its best run counts (the machines
this runs on are shared, and a slow run measures the neighbours, not the method).
Prints one JSON line.

    .venv/bin/python benchmarks/cpu_engine_vs_transformers.py [--requests 48] [--output 96]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import GenerationConfig

from tokenfair.core.request import SamplingParams
from tokenfair.engine.hf.builtin import ByteTokenizer, build_tiny
from tokenfair.engine.hf.loader import LoadedModel
from tokenfair.llm import LLM


def workload(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 513, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (length,), generator=g).tolist() for length in lengths]


def run_engine(prompts: list[list[int]], output: int, batch: int) -> float:
    llm = LLM(
        LoadedModel("builtin:tiny", build_tiny(), ByteTokenizer()),
        kv_tokens=batch * (512 + output) + 1024,
        max_num_seqs=batch,
        max_batched_tokens=2048,
    )
    params = SamplingParams(max_tokens=output, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    began = time.perf_counter()
    completions = llm.generate(prompts, params)
    elapsed = time.perf_counter() - began
    assert all(len(c.token_ids) == output for c in completions)
    return len(prompts) * output / elapsed


@torch.inference_mode()
def run_static_generate(prompts: list[list[int]], output: int, batch: int) -> float:
    model = build_tiny()
    config = GenerationConfig(
        max_new_tokens=output,
        min_new_tokens=output,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )

    def generate(group: list[list[int]]) -> None:
        width = max(map(len, group))  # left padding, as decoder-only generation needs
        ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        model.generate(ids, attention_mask=mask, generation_config=config)

    generate(prompts[:2])  # warm-up
    began = time.perf_counter()
    for start in range(0, len(prompts), batch):  # fixed batches in arrival order
        generate(prompts[start : start + batch])
    return len(prompts) * output / (time.perf_counter() - began)


def run_generate_batch(prompts: list[list[int]], output: int) -> float | None:
    model = build_tiny()
    if not hasattr(model, "generate_batch"):
        return None
    config = GenerationConfig(
        max_new_tokens=output, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    model.generate_batch(prompts[:2], generation_config=config, progress_bar=False)  # warm-up
    began = time.perf_counter()
    results = model.generate_batch(prompts, generation_config=config, progress_bar=False)
    elapsed = time.perf_counter() - began
    generated = sum(len(r.generated_tokens) for r in results.values())
    return generated / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--output", type=int, default=96)
    parser.add_argument(
        "--batch", type=int, default=32, help="engine max_num_seqs and static batch size"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--skip-generate-batch", action="store_true")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = workload(args.requests, args.seed)
    ours = static = 0.0
    continuous: float | None = None
    for _ in range(args.repeats):
        ours = max(ours, run_engine(prompts, args.output, args.batch))
        static = max(static, run_static_generate(prompts, args.output, args.batch))
        if not args.skip_generate_batch:
            run = run_generate_batch(prompts, args.output)
            continuous = None if run is None else max(continuous or 0.0, run)
    print(
        json.dumps(
            {
                "benchmark": "cpu_engine_vs_transformers",
                "model": "builtin:tiny",
                "requests": args.requests,
                "prompt_tokens": "uniform 16..512",
                "output_tokens": args.output,
                "batch": args.batch,
                "threads": torch.get_num_threads(),
                "repeats": args.repeats,
                "tokenfair_tok_s": round(ours, 1),
                "static_generate_tok_s": round(static, 1),
                "generate_batch_tok_s": None if continuous is None else round(continuous, 1),
                "vs_static": round(ours / static, 2),
                "vs_generate_batch": None if continuous is None else round(ours / continuous, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
