"""Decode attention read in place from the paged KV pool, as a Triton kernel (GPUs).

Flash-decoding: every request's context is split into partitions of
`PARTITION_TOKENS`; one program per (request, KV head, partition) reads that part of
the context once, `TILE_TOKENS` positions (several blocks, found through the request's
block table) at a time, for all the query
heads sharing the KV head (grouped-query attention), and keeps a running softmax (its
maximum, its sum and the weighted values). A second kernel folds each head's partials
into its output. Nothing is gathered or padded first, which the torch path
(attention.py: `index_select` per layer, SDPA over a masked batch) does, reading the
context about three times.

Why Triton rather than FlashInfer or FlexAttention: Triton ships with PyTorch's CUDA
builds (no extra wheel, no JIT build of CUDA sources on the serving machine), it
reads our own pool layout (`[kv_heads, slots, head_dim]` per layer) and block tables
as they are, and its interpreter runs the very same kernel on the CPU
(`triton.runtime.interpreter`), so `make test` checks what it computes on a machine
without a GPU. Scores and weighted sums accumulate in float32; float32 models use
IEEE products (no TF32), so their tokens are those of the torch path.

Shapes follow `cpu_kernels.PagedDecodeKernel`: queries `[B, heads, head_dim]` (any
strides with a unit last one), the layer's pool views `[kv_heads, slots, head_dim]`,
int64 block tables `[B, max_blocks]` and context lengths `[B]`, an optional sliding
`window`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

PARTITION_TOKENS = 256  # context tokens per program: enough partitions to fill a GPU
TILE_TOKENS = 64  # context positions a program reads per iteration (several blocks)


def available() -> bool:
    """Whether Triton can be imported (it comes with PyTorch's CUDA builds)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _next_power_of_two(n: int, least: int = 16) -> int:
    size = least
    while size < n:
        size *= 2
    return size


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The two kernels: compiled for the GPU, or run by Triton's interpreter when
    `TRITON_INTERPRET=1` was set before Triton was imported (the tests, on the CPU)."""
    import triton

    from tokenfair.engine.hf import triton_decode_kernels as kernels

    return triton.jit(kernels.partials), triton.jit(kernels.reduce)


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (on CPU tensors)."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def check_block_size(block_size: int) -> None:
    """ValueError unless the kernel can read blocks of `block_size` positions: a power
    of two from 16 (its products' smallest side) to a partition."""
    if not 16 <= block_size <= PARTITION_TOKENS or block_size & (block_size - 1):
        raise ValueError(
            "the Triton decode kernel needs a power-of-two block size from 16 to "
            f"{PARTITION_TOKENS}, got {block_size}"
        )


def partitions_for(longest: int) -> int:
    """Partitions a context of `longest` tokens is split into (fixed per graph bucket)."""
    return max(1, -(-longest // PARTITION_TOKENS))


def paged_decode(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    window: int | None = None,
    partitions: int = 1,
) -> torch.Tensor:
    """Attention output `[B, heads, head_dim]` for single queries `[B, heads, head_dim]`.

    `partitions` must cover the longest context (`partitions_for`); it is an argument,
    not read from `context_lens`, so the launch needs no host sync (CUDA graphs).
    On CPU tensors it runs in Triton's interpreter (the tests; slow).
    """
    requests, heads, head_dim = query.shape
    kv_heads, _, kv_dim = keys.shape
    if kv_dim != head_dim or keys.stride() != values.stride() or keys.stride(-1) != 1:
        raise ValueError("keys and values must be [kv_heads, slots, head_dim] pool views")
    if query.stride(-1) != 1 or heads % kv_heads:
        raise ValueError("queries need a unit stride in head_dim and heads a multiple of kv heads")
    check_block_size(block_size)
    group = heads // kv_heads
    device = query.device
    out = torch.empty((requests, heads, head_dim), dtype=query.dtype, device=device)
    if requests == 0:
        return out
    part_max = torch.empty((requests, heads, partitions), dtype=torch.float32, device=device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty(
        (requests, heads, partitions, head_dim), dtype=torch.float32, device=device
    )
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    if device.type != "cuda" and not interpreted():
        raise ValueError(
            "the Triton decode kernel runs on CUDA tensors (on the CPU only in Triton's "
            "interpreter: TRITON_INTERPRET=1 before Triton is imported)"
        )
    partial_kernel, reduce_kernel = _kernels()
    d_pad = _next_power_of_two(head_dim)
    partial_kernel[(requests, kv_heads, partitions)](
        query,
        keys,
        values,
        tables,
        lens,
        part_max,
        part_sum,
        part_acc,
        query.stride(0),
        query.stride(1),
        keys.stride(0),
        tables.stride(0),
        float(scale),
        int(window) if window else 1 << 30,
        partitions,
        heads,
        GROUP=group,
        GROUP_PAD=_next_power_of_two(group),
        D=head_dim,
        D_PAD=d_pad,
        BLOCK=block_size,
        TILE=max(block_size, TILE_TOKENS),
        PART=PARTITION_TOKENS,
        # float32: IEEE products, as the torch path (no TF32); else the dtype's own.
        PRECISION="ieee" if query.dtype == torch.float32 else None,
    )
    reduce_kernel[(requests, heads)](
        part_max,
        part_sum,
        part_acc,
        out,
        out.stride(0),
        out.stride(1),
        partitions,
        heads,
        D=head_dim,
        D_PAD=d_pad,
        P_PAD=_next_power_of_two(partitions, least=2),
    )
    return out
