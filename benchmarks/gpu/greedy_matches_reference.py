"""On CUDA, the engine's greedy tokens are transformers' own: graphs or not, torch or Triton attention.

The CPU tests check the engine against `model.generate` on tiny models; this runs the same
comparison on a GPU, where the paged attention, the bucketed decode steps and their CUDA
graph replays take paths the CPU never does. Tiny random models of three families
(float32, TF32 off, so the reference and the engine round alike), prompts of mixed
lengths that pad decode batches and span several KV blocks, and a pool small enough to
preempt. Prints one JSON line: per family and mode, how many requests match the
reference token for token, and the first diverging position of any that do not.

Exits with a message (and status 0) when there is no CUDA device; `--smoke` runs it on
CPU to check the script.

    PYTHONPATH=src python benchmarks/gpu/greedy_matches_reference.py [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tokenfair.core.request import Request, SamplingParams
from tokenfair.engine.hf.factory import make_hf_engine
from tokenfair.engine.hf.loader import LoadedModel

VOCAB = 512
LENGTHS = [3, 40, 95, 300, 17, 130, 64, 1]
MAX_TOKENS = [14, 17, 20, 23, 26, 29, 32, 35]


def tiny_model(family: str, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2, **shape))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, num_key_value_heads=2, **shape))
    else:
        config = GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=1024,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = GPT2LMHeadModel(config)
    return model.to(device).eval()


def prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (length,), generator=g).tolist()


def reference(model: torch.nn.Module, tokens: list[int], max_tokens: int, device: str) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([tokens], device=device),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(tokens) :].tolist()


def engine_tokens(
    model, prompts, static_decode: bool, kv_tokens: int, kernel: str | None = None
) -> list[list[int]]:
    engine = make_hf_engine(
        LoadedModel("tiny", model, None),
        kv_tokens=kv_tokens,
        max_batched_tokens=1024,
        static_decode=static_decode,
        decode_kernel=kernel,
    )
    requests = []
    for i, (tokens, max_tokens) in enumerate(zip(prompts, MAX_TOKENS, strict=True)):
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        request = Request(f"r{i}", "c", len(tokens), 0.0, sampling, prompt_token_ids=tokens)
        assert engine.add_request(request)
        requests.append(request)
    engine.run_until_done(max_steps=20_000)
    kv = engine.scheduler.kv
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks, "KV blocks held after every request ended"
    return [list(r.output_token_ids) for r in requests]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="run on CPU: checks the script")
    args = parser.parse_args()
    if args.smoke:
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        print(json.dumps({"benchmark": "gpu_greedy_matches_reference", "skipped": "no CUDA"}))
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    prompts = [prompt(n, seed=400 + n) for n in LENGTHS]
    results: dict[str, dict[str, object]] = {}
    all_match = True
    for family in ("llama", "qwen2", "gpt2"):
        model = tiny_model(family, device)
        expected = [
            reference(model, p, m, device) for p, m in zip(prompts, MAX_TOKENS, strict=True)
        ]
        # 1,024 tokens: room for every request, so decode batches pad to their buckets;
        # 512: too few for all at once, so requests are preempted and recomputed. The
        # decodes' attention: the torch path (gathers and SDPA), or the Triton kernel
        # reading the pool in place (triton_decode).
        for mode, static, kv_tokens, kernel in (
            ("graphs", True, 1024, None),
            ("eager", False, 1024, None),
            ("graphs-preempting", True, 512, None),
            ("triton-graphs", True, 1024, "triton"),
            ("triton-eager-preempting", False, 512, "triton"),
        ):
            if kernel and args.smoke and (family != "llama" or kv_tokens < 1024):
                continue  # interpreted on the CPU, Triton is slow: one run checks the script
            got = engine_tokens(model, prompts, static, kv_tokens, kernel)
            diffs = {
                f"r{i}": first_difference(g, e)
                for i, (g, e) in enumerate(zip(got, expected, strict=True))
                if g != e
            }
            matched = len(prompts) - len(diffs)
            all_match &= not diffs
            results[f"{family}/{mode}"] = {
                "matched": matched,
                "of": len(prompts),
                "diverged_at": diffs,
            }
    print(
        json.dumps(
            {
                "benchmark": "gpu_greedy_matches_reference",
                "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
                "torch": torch.__version__,
                "all_match": all_match,
                "results": results,
            }
        )
    )
    return 0 if all_match else 1


if __name__ == "__main__":
    sys.exit(main())
