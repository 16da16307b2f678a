"""Reserve admission's peak-memory check.

A request is admitted only if the pool can hold every running request and it at their
peak, each growing to its max_tokens, so nothing ever runs out mid-generation (the
paper's system). Blocks are still taken as tokens arrive; this only decides admission.

Each request holds its tokens and grows by its remaining max_tokens. Sorted by
remaining growth, longest first, the moment the i-th request ends is when requests
1..i are all still alive and have grown by its growth; usage is highest at one of
those moments. Shorter requests finish and free their blocks before longer ones peak,
as the paper's router counts it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.request import Request
from tokenfair.core.scheduler_config import SchedulerConfig


def reserve_peak_fits(
    batch: Sequence[Request], kv: KVCacheManager, config: SchedulerConfig
) -> bool:
    """Can the pool hold `batch` (the running requests and the candidate) at its peak?"""
    if config.reserve_peak_excludes_last_token:
        # The last output token is sampled, never written to the cache; a request not
        # yet prefilled counts as prompt + 1 growing by max_tokens - 1 (the router's
        # estimate for a candidate).
        spans = [
            (r.max_tokens - r.num_output_tokens - 1, r.input_tokens + max(r.num_output_tokens, 1))
            for r in batch
        ]
    else:
        spans = [(r.max_tokens - r.num_output_tokens, r.num_tokens) for r in batch]
    spans.sort(reverse=True)
    limit = kv.num_blocks
    if config.adapter_tokens_per_client:
        adapters = len({r.client for r in batch})
        limit -= kv.blocks_for(adapters * config.adapter_tokens_per_client)
    if config.reserve_strictly_below_pool:
        limit -= 1  # whole blocks: strictly below the limit means at most limit - 1
    held = 0
    # Rounded per request, `alive` requests take at most alive - 1 blocks more than
    # their tokens rounded together (each wastes less than one block).
    rounding = 0 if kv.block_size == 1 else 1
    for alive, (growth, tokens) in enumerate(spans, start=1):
        held += tokens
        if kv.blocks_for(held + alive * growth) + (alive - 1) * rounding > limit:
            return False
    return True
