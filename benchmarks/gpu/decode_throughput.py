"""Prefill and decode throughput on CUDA: tokenfair's engine vs transformers' generate_batch.

Builds a Llama-2-7B-shaped model (32 layers, hidden 4096, 32 heads, vocab 32000) with
random bf16 weights on the GPU (nothing downloaded), then for batch sizes 1, 32 and 128:

- prefill tok/s: B prompts of `--prompt` tokens, generating one token each;
- decode tok/s: B requests generating `--output` tokens; decode time is the run's time
  minus the prefill-only run's, over B x (output - 1) tokens;
- for our engine, the mean decode step time at each batch and its share of the memory
  bandwidth limit: every decode step reads all weights once plus every running
  request's KV cache, so the limit is (weight bytes + batch x mean context x KV bytes
  per token) / `--hbm-tb-s`.

Pure-decode steps run as CUDA graphs in batch/width buckets (the engine's default on
CUDA); `--eager` measures without them, for comparison. `--decode-kernel triton`
attends the decodes with the Triton kernel that reads the KV pool in place
(engine/hf/triton_decode.py) instead of gathering contexts for SDPA.

Exits with a message (and status 0) when there is no CUDA device. `--smoke` runs the
same code with a tiny model on CPU, to check the script itself. Prints one JSON line.

    PYTHONPATH=src .venv/bin/python benchmarks/gpu/decode_throughput.py [--eager]
        [--batches 1 32 128] [--prompt 512] [--output 128] [--hbm-tb-s 4.8]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from tokenfair.core.request import Request, SamplingParams
from tokenfair.engine.hf.factory import make_hf_engine
from tokenfair.engine.hf.kv_pool import kv_bytes_per_token as kv_bytes_per_token_for
from tokenfair.engine.hf.loader import LoadedModel

LLAMA2_7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    max_position_embeddings=4096,
)
SMOKE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=4096,
)


def build_model(shape: dict, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**shape, dtype=dtype))
    return model.to(dtype).eval()  # type: ignore[arg-type]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prompts_for(batch: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(batch)]


def run_ours(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> tuple[float, float]:
    """Wall time of the whole run, and mean time of its pure-decode steps."""
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(
            Request(f"{tag}-{i}", "bench", len(prompt), 0.0, sampling, prompt_token_ids=prompt)
        )
    executor = engine.executor
    decode_s, decode_steps = 0.0, 0
    began = time.perf_counter()
    while engine.has_unfinished():
        step_began = time.perf_counter()
        engine.step()
        if executor.last_shape[0] == 0:  # no prefill tokens: a pure decode step
            decode_s += time.perf_counter() - step_began
            decode_steps += 1
    return time.perf_counter() - began, decode_s / max(decode_steps, 1)


def run_generate_batch(model, prompts: list[list[int]], max_tokens: int, device: str) -> float:
    config = GenerationConfig(
        max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    sync(device)
    began = time.perf_counter()
    model.generate_batch(prompts, generation_config=config, progress_bar=False)
    sync(device)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument("--hbm-tb-s", type=float, default=4.8, help="memory bandwidth (H200: 4.8)")
    parser.add_argument("--skip-generate-batch", action="store_true")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs for decode steps")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU: checks the script")
    parser.add_argument(
        "--decode-kernel",
        choices=["torch", "triton"],
        default="torch",
        help="the decodes' attention: gathers and SDPA, or the Triton kernel reading the pool",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one decode run per batch (Python side) and print where it spends",
    )
    args = parser.parse_args()

    if args.smoke:
        device, dtype, shape = "cpu", torch.float32, SMOKE
    elif not torch.cuda.is_available():
        print(json.dumps({"benchmark": "gpu_decode_throughput", "skipped": "no CUDA device"}))
        print(
            "no CUDA device: this benchmark needs a GPU (use --smoke to check the script)",
            file=sys.stderr,
        )
        return 0
    else:
        device, dtype, shape = "cuda", torch.bfloat16, LLAMA2_7B

    model = build_model(shape, device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = args.hbm_tb_s * 1e12
    kv_bytes_per_token = kv_bytes_per_token_for(model.config, dtype)
    vocab = shape["vocab_size"]
    kv_tokens = max(args.batches) * (args.prompt + args.output + 16) + 4096
    loaded = LoadedModel("llama-2-7b-shaped-random", model, None)
    engine = make_hf_engine(
        loaded,
        kv_tokens=kv_tokens,
        max_num_seqs=max(args.batches),
        max_batched_tokens=8192,
        static_decode=not args.eager,
        decode_kernel="triton" if args.decode_kernel == "triton" else None,
    )
    run_ours(engine, prompts_for(2, 16, vocab), 4, "warm")

    ours: dict[str, dict[str, float]] = {}
    for batch in args.batches:
        prompts = prompts_for(batch, args.prompt, vocab)
        prefill_s, _ = run_ours(engine, prompts, 1, f"p{batch}")
        total_s, step_s = run_ours(engine, prompts, args.output, f"d{batch}")
        decode_tokens = batch * (args.output - 1)
        mean_context = args.prompt + args.output / 2
        bound_step_s = (weight_bytes + batch * mean_context * kv_bytes_per_token) / bandwidth
        ours[str(batch)] = {
            "prefill_tok_s": round(batch * args.prompt / prefill_s, 1),
            "decode_tok_s": round(decode_tokens / max(total_s - prefill_s, 1e-9), 1),
            "decode_step_ms": round(1000 * step_s, 3),
            "bound_step_ms": round(1000 * bound_step_s, 3),
            "bandwidth_share": round(bound_step_s / step_s, 3),
        }

    if args.profile:
        for batch in args.batches:
            profile = cProfile.Profile()
            profile.enable()
            run_ours(engine, prompts_for(batch, args.prompt, vocab), args.output, f"prof{batch}")
            profile.disable()
            report = io.StringIO()
            pstats.Stats(profile, stream=report).sort_stats("tottime").print_stats(25)
            print(f"== profile, batch {batch} (by own time)\n{report.getvalue()}", file=sys.stderr)

    theirs: dict[str, dict[str, float]] | None = None
    if not args.skip_generate_batch and hasattr(model, "generate_batch"):
        model.set_attn_implementation("sdpa")  # let generate_batch pick its paged variant
        run_generate_batch(model, prompts_for(2, 16, vocab), 4, device)
        theirs = {}
        for batch in args.batches:
            prompts = prompts_for(batch, args.prompt, vocab)
            prefill_s = run_generate_batch(model, prompts, 1, device)
            total_s = run_generate_batch(model, prompts, args.output, device)
            theirs[str(batch)] = {
                "prefill_tok_s": round(batch * args.prompt / prefill_s, 1),
                "decode_tok_s": round(
                    batch * (args.output - 1) / max(total_s - prefill_s, 1e-9), 1
                ),
            }

    print(
        json.dumps(
            {
                "benchmark": "gpu_decode_throughput",
                "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
                "model": "llama-2-7b-shaped random" if not args.smoke else "tiny smoke",
                "dtype": str(dtype),
                "weight_gb": round(weight_bytes / 1e9, 2),
                "weights_only_step_ms": round(1000 * weight_bytes / bandwidth, 3),
                "cuda_graphs": not args.eager and device == "cuda",
                "decode_kernel": args.decode_kernel,
                "prompt": args.prompt,
                "output": args.output,
                "tokenfair": ours,
                "generate_batch": theirs,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
