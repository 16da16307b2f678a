"""The bridge that makes a stock transformers model read and write our KV pool.

transformers' attention layers call `cache.update(key, value, layer_idx, ...)` with the
keys and values of the tokens they just projected, and attend over whatever it returns.
`PagedKVCache.update` stores those new keys/values in the pool slots the scheduler chose
for them, then returns what the step's attention needs:

- "paged" mode (default): the layer's whole slot-addressed pool; our registered
  attention function (`attention.paged_attention`) gathers each request's context
  from it using the step layout, so no request ever attends over another's tokens and
  no padding or block-diagonal mask the size of the whole batch is built;
- "masked" mode: every request's context gathered into one packed sequence, to be
  attended with the block-diagonal mask from `StepLayout.packed_mask`; this works with any
  stock attention implementation (eager, sdpa) and serves as a cross-check.

Positions are always passed explicitly, so the cache never needs to report a length.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from tokenfair.engine.hf.kv_pool import KVPool
from tokenfair.engine.hf.step_layout import StepLayout


class PagedKVCache(Cache):
    def __init__(self, pool: KVPool, packed: bool = False) -> None:
        super().__init__(layers=[])
        self.pool = pool
        self.packed = packed
        self.layout: StepLayout | None = None  # set by the executor before each forward

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self.layout
        if layout is None:
            raise RuntimeError("PagedKVCache used outside an executor step (no layout set)")
        # The model hands us [1, kv_heads, Q, head_dim]: batch 1, the packed sequence.
        self.pool.write(layer_idx, layout.new_slots, key_states[0], value_states[0])
        keys, values = self.pool.layer(layer_idx)
        if not self.packed:
            return keys, values
        slots = layout.packed_slots()
        return keys.index_select(1, slots)[None], values.index_select(1, slots)[None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0
