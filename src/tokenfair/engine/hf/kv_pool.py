"""The paged KV pool: every layer's keys and values, in fixed-size blocks we own.

The scheduler's KV manager decides which block holds which token; this pool only holds
the numbers. One tensor covers all layers so that a swap copies a set of blocks for every
layer in a single indexing operation instead of one per layer:

    data[layer, 0 = keys | 1 = values, kv_head, block, offset_in_block, head_dim]

A token's *slot* is `block * block_size + offset`; attention gathers keys by slot from
the per-layer view `[kv_heads, num_blocks * block_size, head_dim]`.

The swap area is a second, smaller tensor of the same layout in CPU memory (pinned when
the pool is on CUDA, for faster host-device copies).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenfair.engine.hf.cpu_runtime import advise_huge_pages


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token's KV looks like for a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x dtype bytes (SPEC section 5)."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element

    @classmethod
    def from_config(cls, config, dtype: torch.dtype) -> KVShape:
        """Read the attention geometry from a transformers config (Llama, Qwen2, Mistral, GPT-2...)."""
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return cls(config.num_hidden_layers, num_kv_heads, head_dim, dtype)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """KV bytes one token costs for a model config: what the CLI prints at start."""
    return KVShape.from_config(config, dtype).bytes_per_token


def describe_kv_budget(shape: KVShape, num_blocks: int, block_size: int) -> str:
    """One line for logs and the CLI: per-token cost and the pool's size."""
    tokens = num_blocks * block_size
    total = tokens * shape.bytes_per_token
    return (
        f"KV cache: {shape.bytes_per_token / 1024:.1f} KiB/token "
        f"({shape.num_layers} layers x {shape.num_kv_heads} kv heads x {shape.head_dim} dims x "
        f"{shape.dtype}), pool {tokens} tokens = {total / 2**20:.1f} MiB"
    )


def blocks_for_memory(shape: KVShape, block_size: int, memory_bytes: int) -> int:
    """How many blocks fit in `memory_bytes` (for pools sized by a memory fraction)."""
    return max(0, memory_bytes // (shape.bytes_per_token * block_size))


class KVPool:
    """Device KV blocks plus a bounded CPU swap area, with block copies between them."""

    def __init__(
        self,
        shape: KVShape,
        num_blocks: int,
        block_size: int,
        device: torch.device | str,
        num_swap_blocks: int = 0,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"KV pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        layout = (shape.num_layers, 2, shape.num_kv_heads)
        tail = (block_size, shape.head_dim)
        self.data = torch.empty((*layout, num_blocks, *tail), dtype=shape.dtype, device=self.device)
        if self.device.type == "cpu":  # before the first touch, see cpu_runtime
            advise_huge_pages(self.data.data_ptr(), self.data.numel() * self.data.element_size())
        self.data.zero_()
        pin = self.device.type == "cuda"
        self.swap = torch.zeros(
            (*layout, num_swap_blocks, *tail), dtype=shape.dtype, device="cpu", pin_memory=pin
        )
        # Per-layer slot-addressed views; they share storage with `data`.
        slots = num_blocks * block_size
        self._keys = [
            self.data[i, 0].view(shape.num_kv_heads, slots, shape.head_dim)
            for i in range(shape.num_layers)
        ]
        self._values = [
            self.data[i, 1].view(shape.num_kv_heads, slots, shape.head_dim)
            for i in range(shape.num_layers)
        ]

    @property
    def num_swap_blocks(self) -> int:
        return self.swap.shape[3]

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one layer as `[kv_heads, slots, head_dim]` views."""
        return self._keys[layer_idx], self._values[layer_idx]

    def write(
        self, layer_idx: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Store new `[kv_heads, n, head_dim]` keys/values at `slots` (n slot indices)."""
        k, v = self.layer(layer_idx)
        k.index_copy_(1, slots, keys.to(k.dtype))
        v.index_copy_(1, slots, values.to(v.dtype))

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (device block, swap block) pairs from the device pool to the swap area."""
        if not pairs:
            return
        device_blocks = torch.tensor([d for d, _ in pairs], device=self.device)
        swap_blocks = torch.tensor([s for _, s in pairs])
        # Synchronous on purpose: the scheduler may hand the device blocks to another
        # request in this very step, so the copy must be done before the forward pass.
        self.swap.index_copy_(3, swap_blocks, self.data.index_select(3, device_blocks).cpu())

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (swap block, device block) pairs from the swap area back into the pool."""
        if not pairs:
            return
        swap_blocks = torch.tensor([s for s, _ in pairs])
        device_blocks = torch.tensor([d for _, d in pairs], device=self.device)
        moved = self.swap.index_select(3, swap_blocks)
        self.data.index_copy_(3, device_blocks, moved.to(self.device))
