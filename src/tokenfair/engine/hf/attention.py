"""Ragged attention over the paged pool, registered with transformers by name.

`PagedKVCache.update` (paged mode) returns a layer's whole pool; this function, which
the model calls in place of its stock attention, attends each request over its own
context only:

- single-query requests (decodes), when the layout carries block tables: one call of a
  kernel that reads every context in place from the pool, the engine's C kernel on
  the CPU (cpu_kernels) or its Triton kernel on a GPU (triton_decode);
- otherwise single-query requests one SDPA call per decode group (see step_layout),
  their contexts gathered into a padded `[B, kv_heads, width, head_dim]` batch with a
  validity mask;
- each multi-token prefill chunk in its own SDPA call over its cached prefix plus its
  new tokens, causally.

This costs what per-request attention costs, where one block-diagonal mask over the
whole packed batch would cost (total queries x total keys).

Called without a step layout (e.g. `model.generate` on a model an executor has
adopted), it behaves exactly like transformers' sdpa attention, masks included, so
adopting a model never breaks its stock generation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from tokenfair.engine.hf import triton_decode
from tokenfair.engine.hf.cpu_kernels import paged_decode_kernel
from tokenfair.engine.hf.step_layout import DecodeTables, StepLayout

ATTENTION_NAME = "tokenfair_paged"
LAYOUT_KWARG = "tokenfair_layout"


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query: [1, heads, Q, head_dim]; key/value: [kv_heads, slots, head_dim] pool views.

    Returns [1, Q, heads, head_dim], the layout transformers' attention layers expect.
    """
    layout: StepLayout | None = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            sliding_window=sliding_window,
            **kwargs,
        )
    group_masks, chunk_masks = layout.masks(sliding_window)
    kv_heads, _, head_dim = key.shape
    outputs: list[torch.Tensor] = []

    if layout.decode_tables is not None:
        outputs.append(
            _decode_in_place(query, key, value, layout.decode_tables, scaling, sliding_window)
        )

    for group, mask in zip(layout.groups, group_masks, strict=True):
        b, width = group.size, group.width
        q = (
            query[0, :, group.row_begin : group.row_end].transpose(0, 1).unsqueeze(2)
        )  # [B, H, 1, D]
        k = key.index_select(1, group.slots).view(kv_heads, b, width, head_dim).transpose(0, 1)
        v = value.index_select(1, group.slots).view(kv_heads, b, width, head_dim).transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scaling, enable_gqa=True
        )
        outputs.append(out.squeeze(2)[None])  # [1, B, heads, D]

    for chunk, chunk_mask in zip(layout.chunks, chunk_masks, strict=True):
        q = query[:, :, chunk.q_begin : chunk.q_end]
        k = key.index_select(1, chunk.context_slots)[None]
        v = value.index_select(1, chunk.context_slots)[None]
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=chunk_mask,
            is_causal=chunk_mask is None,
            scale=scaling,
            enable_gqa=True,
        )
        outputs.append(out.transpose(1, 2))  # [1, n, heads, D]

    return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0], None


def _decode_in_place(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decode: DecodeTables,
    scaling: float | None,
    window: int | None,
) -> torch.Tensor:
    """The decodes' attention `[1, B, heads, D]`, read from the pool by the layout's
    kernel: the C one on the CPU, the Triton one on a GPU."""
    rows = query[0, :, : decode.size].transpose(0, 1)  # [B, heads, D], a strided view
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    tables, lens = decode.block_tables, decode.context_lens
    if decode.kernel == "triton":
        out = triton_decode.paged_decode(
            rows, key, value, tables, lens, decode.block_size, scale, window, decode.partitions
        )
        return out[None]
    kernel = paged_decode_kernel()
    if kernel is None:
        raise RuntimeError("a step laid out for the CPU attention kernel, but it is not built")
    return kernel(rows, key, value, tables, lens, decode.block_size, scale, window)[None]


AttentionInterface.register(ATTENTION_NAME, paged_attention)
# Outside executor steps the stock mask builders run; give them sdpa's masks.
AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
