"""Calibrate the simulator on this machine: time real engine steps, fit a step profile.

`measure_profile` runs small synthetic workloads through a real engine (scheduler +
HFExecutor + model, so scheduling and Python overhead are included, as they are in a
real run) over a grid of batch sizes and prompt lengths, records every step's shape
(prefill tokens, decode requests, context tokens: the same quantities the simulator's
SimExecutor computes) with its wall time, and fits the simulator's linear step-time
form (`tokenfair.engine.sim.profile.fit_linear_profile`). Swap copies are timed
separately for `swap_token_s`.

`tokenfair profile --model M --out profile.json` is this plus `save_profile`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from tokenfair.core.request import Request, SamplingParams
from tokenfair.engine.hf.executor import HFExecutor
from tokenfair.engine.hf.factory import make_hf_engine
from tokenfair.engine.hf.kv_pool import KVPool
from tokenfair.engine.hf.loader import LoadedModel, load_model
from tokenfair.engine.sim.profile import LinearStepProfile, fit_linear_profile

log = logging.getLogger(__name__)

Sample = tuple[int, int, int, float]  # (prefill tokens, decode requests, context tokens, s)

DEFAULT_BATCH_SIZES = (1, 4, 16, 32)
DEFAULT_PROMPT_LENGTHS = (16, 128, 384)


def _workload(
    batch_size: int, prompt_len: int, decode_steps: int, vocab: int, tag: str
) -> list[Request]:
    generator = torch.Generator().manual_seed(batch_size * 1000 + prompt_len)
    return [
        Request(
            f"{tag}-{i}",
            "profile",
            prompt_len,
            0.0,
            SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True),
            prompt_token_ids=torch.randint(0, vocab, (prompt_len,), generator=generator).tolist(),
        )
        for i in range(batch_size)
    ]


def measure_steps(
    loaded: LoadedModel,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    prompt_lengths: Sequence[int] = DEFAULT_PROMPT_LENGTHS,
    decode_steps: int = 8,
    max_batched_tokens: int = 4096,
    **engine_options,
) -> list[Sample]:
    """Time every engine step of one workload per (batch size, prompt length)."""
    # Every request of the largest batch at once, in whole blocks of any size up to 128.
    per_request = -(-(max(prompt_lengths) + decode_steps + 2) // 128) * 128
    kv_tokens = max(batch_sizes) * per_request + 1024
    engine = make_hf_engine(
        loaded,
        kv_tokens=kv_tokens,
        max_num_seqs=max(batch_sizes),
        max_batched_tokens=max_batched_tokens,
        **engine_options,
    )
    executor = engine.executor
    assert isinstance(executor, HFExecutor)
    vocab = executor.vocab_size
    samples: list[Sample] = []
    # The first workload warms up allocators and kernels; its timings are dropped.
    plan = [(min(batch_sizes), min(prompt_lengths), True)]
    plan += [(b, n, False) for b in batch_sizes for n in prompt_lengths]
    for index, (batch_size, prompt_len, warmup) in enumerate(plan):
        for request in _workload(batch_size, prompt_len, decode_steps, vocab, f"w{index}"):
            engine.add_request(request)
        while engine.has_unfinished():
            began = time.perf_counter()
            engine.step()
            elapsed = time.perf_counter() - began
            if not warmup and executor.last_shape != (0, 0, 0):
                samples.append((*executor.last_shape, elapsed))
    return samples


def measure_swap_token_s(loaded: LoadedModel, block_size: int = 16, blocks: int = 64) -> float:
    """Seconds per token to copy KV out to the swap area and back, halved (one direction)."""
    from tokenfair.engine.hf.kv_pool import KVShape

    param = next(loaded.model.parameters())
    shape = KVShape.from_config(loaded.model.config, param.dtype)
    pool = KVPool(shape, blocks, block_size, param.device, num_swap_blocks=blocks)
    pairs = [(i, i) for i in range(blocks)]
    pool.swap_out(pairs)  # warm-up
    began = time.perf_counter()
    for _ in range(3):
        pool.swap_out(pairs)
        pool.swap_in(pairs)
    return (time.perf_counter() - began) / (3 * 2 * blocks * block_size)


def measure_profile(
    model: str | LoadedModel,
    *,
    name: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    prompt_lengths: Sequence[int] = DEFAULT_PROMPT_LENGTHS,
    decode_steps: int = 8,
    **engine_options,
) -> LinearStepProfile:
    """Measure step times of `model` on this machine and fit the simulator's profile."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device, dtype)
    samples = measure_steps(loaded, batch_sizes, prompt_lengths, decode_steps, **engine_options)
    swap_token_s = measure_swap_token_s(loaded)
    param = next(loaded.model.parameters())
    description = (
        f"measured on this machine ({param.device}, {param.dtype}, {torch.get_num_threads()} threads): "
        f"{len(samples)} engine steps, batch sizes {list(batch_sizes)}, prompt lengths {list(prompt_lengths)}"
    )
    profile = fit_linear_profile(
        samples, name or f"{loaded.name}-measured", description, swap_token_s
    )
    log.info("fitted %s", profile)
    return profile
