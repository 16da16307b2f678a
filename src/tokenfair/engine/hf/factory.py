"""Build a ready Engine around a transformers model: scheduler, HFExecutor, detokenizer.

The KV pool is sized in tokens (`kv_tokens`) or, when that is not given, from a share of
the memory the device has free (`kv_memory_fraction`), capped at what it could ever
hold: `max_num_seqs` sequences at the model's full context. A small model on a big
machine would otherwise reserve (and page in) gigabytes it can never fill.
"""

from __future__ import annotations

import logging
import os

import torch

from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.registry import make_policy
from tokenfair.core.scheduler import Scheduler
from tokenfair.core.scheduler_config import SchedulerOverrides
from tokenfair.engine.engine import Engine
from tokenfair.engine.hf.executor import AttentionMode, HFExecutor
from tokenfair.engine.hf.kv_pool import KVShape, blocks_for_memory
from tokenfair.engine.hf.loader import LoadedModel
from tokenfair.engine.hf.step_layout import DecodeKernel
from tokenfair.engine.hf.tokenizer import IncrementalDetokenizer

log = logging.getLogger(__name__)

DEFAULT_CPU_KV_FRACTION = 0.25  # of the RAM available now: CPU memory is shared with everything
DEFAULT_GPU_KV_FRACTION = 0.85  # of the GPU memory free after the weights
# The KV block size where none is given, on the CPU: the attention kernel reads a
# context block by block, and once blocks have been freed and handed out again a
# request's blocks lie anywhere. 16-token blocks (the scheduler's default) then cost
# 10% of a run of 256 mixed requests, 64-token ones 1-2% (docs/engine.md). vLLM's
# CPU backend takes 128 for the same reason. Prefix caching shares whole blocks only.
DEFAULT_CPU_BLOCK_SIZE = 64


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def kv_tokens_for_memory(
    model: torch.nn.Module, block_size: int, fraction: float | None = None
) -> int:
    """Tokens of KV that fit in `fraction` of the memory free on the model's device."""
    param = next(model.parameters())
    if fraction is None:
        fraction = (
            DEFAULT_GPU_KV_FRACTION if param.device.type == "cuda" else DEFAULT_CPU_KV_FRACTION
        )
    if not 0 < fraction <= 1:
        raise ValueError(f"kv_memory_fraction must be in (0, 1], got {fraction}")
    shape = KVShape.from_config(model.config, param.dtype)
    budget = int(available_memory(param.device) * fraction)
    return blocks_for_memory(shape, block_size, budget) * block_size


def _context(model: torch.nn.Module) -> int:
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    return int(getattr(text, "max_position_embeddings", 0) or 0)


def _most_kv_tokens_usable(model: torch.nn.Module, seqs: int, block_size: int) -> int | None:
    """`seqs` sequences at the model's full context, in whole blocks; None when the model
    states no context length."""
    context = _context(model)
    if context <= 0:
        return None
    blocks_per_sequence = -(-context // block_size)
    return seqs * blocks_per_sequence * block_size


def make_hf_engine(
    loaded: LoadedModel,
    *,
    policy: str | Policy = "fcfs",
    kv_tokens: int | None = None,
    kv_memory_fraction: float | None = None,
    attention: AttentionMode = "paged",
    seed: int = 0,
    static_decode: bool | None = None,
    decode_kernel: bool | DecodeKernel | None = None,
    pack_linear: bool | None = None,
    fuse_projections: bool = True,
    **scheduler_options: object,
) -> Engine:
    """An Engine serving `loaded` with the given policy (a name, or one built with the
    tenants' weights) and scheduler settings
    (any `SchedulerConfig` field: max_num_seqs, max_batched_tokens, block_size,
    swap_tokens, admission, preemption, enable_chunked_prefill, ...).

    `static_decode` pads pure-decode steps to bucketed shapes and, on CUDA, replays
    them as CUDA graphs (see `decode_graphs`); None turns it on for CUDA only.
    `decode_kernel` attends decodes with a kernel that reads the pool in place: "c" on
    the CPU (see `cpu_kernels`), "triton" on a GPU (see `triton_decode`); None uses
    the CPU one wherever it applies and builds. `pack_linear` runs float32 CPU linear
    layers on prepacked oneDNN weights (see `cpu_linear`); None packs wherever that
    applies. `fuse_projections` stacks each layer's QKV and gate-up projections into
    one matrix each (see `fused_projections`). A model on the CPU takes
    `DEFAULT_CPU_BLOCK_SIZE`-token KV blocks unless `block_size` is given."""
    on_cpu = next(loaded.model.parameters()).device.type == "cpu"
    if "block_size" not in scheduler_options and on_cpu:
        scheduler_options = {**scheduler_options, "block_size": DEFAULT_CPU_BLOCK_SIZE}
    settings = SchedulerOverrides(scheduler_options)
    block_size = int(settings.value("block_size"))
    if kv_tokens is None:
        kv_tokens = kv_tokens_for_memory(loaded.model, block_size, kv_memory_fraction)
        ceiling = _most_kv_tokens_usable(
            loaded.model, int(settings.value("max_num_seqs")), block_size
        )
        if ceiling is not None and ceiling < kv_tokens:
            log.info(
                "KV pool: %d tokens (%d sequences at the full context of %d), not the %d "
                "the memory share would hold",
                ceiling,
                ceiling // _context(loaded.model),
                _context(loaded.model),
                kv_tokens,
            )
            kv_tokens = ceiling
    config = settings.config(kv_tokens)
    scheduler = Scheduler(config, make_policy(policy) if isinstance(policy, str) else policy)
    executor = HFExecutor(
        loaded.model,
        num_blocks=config.num_blocks,
        block_size=config.block_size,
        num_swap_blocks=config.num_swap_blocks,
        attention=attention,
        seed=seed,
        static_decode=static_decode,
        decode_kernel=decode_kernel,
        pack_linear=pack_linear,
        fuse_projections=fuse_projections,
    )
    # Without a tokenizer (token-id workloads, benchmarks) the engine produces no text.
    detokenizer = IncrementalDetokenizer(loaded.tokenizer) if loaded.tokenizer else None
    return Engine(scheduler, executor, detokenizer=detokenizer)
