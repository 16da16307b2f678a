"""vLLM's own prefix cache as tokenfair's locality-aware policies see it.

`vtc-lpm` and `dlpm` order waiting requests by how much of their prompt is cached
(core/prefix_cache.py). Inside vLLM that is vLLM's cache: this view answers the
policy's questions with vLLM's own lookup and hears of its changes.

- a waiting request's block hashes are vLLM's (`Request.block_hashes`, computed by
  vLLM as tokens arrive), found through the ledger's shadow -> vLLM request mapping;
- how much of a request is cached: the lookup vLLM makes at admission
  (`coordinator.find_longest_cache_hit`, without the hit-rate statistics that
  `get_computed_blocks` records), in blocks;
- a block becoming findable: `BlockPool.cache_full_blocks` is wrapped to tell the
  policy the hashes it cached (a waiting request sharing them sees its prefix grow);
- an eviction: `BlockPool._maybe_evict_cached_block` is wrapped to count evictions.
  vLLM evicts as it likes, so every eviction counts as one the policy may care about,
  and a policy checks its choice again after any (`want`/`unwant` do nothing here).

Both wrapped methods exist with these signatures in vLLM 0.32 and 0.33; the module
touches nothing else of vLLM, and imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenfair.core.request import Request


class VllmPrefixCache:
    """The `PrefixCache` view of a vLLM scheduler's KV cache manager."""

    def __init__(
        self,
        kv_cache_manager: Any,
        block_size: int,
        vllm_request: Callable[[str], Any],
    ) -> None:
        """`vllm_request(request_id)`: the vLLM request a shadow request stands for."""
        self.enable_prefix_caching = bool(kv_cache_manager.enable_caching)
        self.on_cached: list[Callable[[list[Any]], None]] = []
        self.wanted_evictions = 0
        self._manager = kv_cache_manager
        self._block_size = block_size
        self._vllm_request = vllm_request
        if self.enable_prefix_caching:
            self._follow(kv_cache_manager.block_pool)

    def _follow(self, pool: Any) -> None:
        cache_full_blocks = pool.cache_full_blocks
        maybe_evict = pool._maybe_evict_cached_block

        def cached(request: Any, blocks: Any, num_cached_blocks: int, num_full_blocks: int,
                   block_size: int, kv_cache_group_id: int, *args: Any, **kwargs: Any) -> Any:  # fmt: skip
            result = cache_full_blocks(
                request, blocks, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id, *args, **kwargs,
            )  # fmt: skip
            # One group is enough to follow: a prefix is cached in all or none.
            if kv_cache_group_id == 0 and self.on_cached and num_full_blocks > num_cached_blocks:
                keys = list(request.block_hashes[num_cached_blocks:num_full_blocks])
                for listener in self.on_cached:
                    listener(keys)
            return result

        def evict(block: Any) -> bool:
            evicted = maybe_evict(block)
            if evicted:
                self.wanted_evictions += 1
            return bool(evicted)

        pool.cache_full_blocks = cached
        pool._maybe_evict_cached_block = evict

    def block_hashes(self, request: Request, count: int) -> list[Any]:
        return list(self._vllm_request(request.request_id).block_hashes[:count])

    def matchable_blocks(self, request: Request) -> int:
        # At least one token is always computed, as vLLM's own lookup requires.
        return max(0, self._vllm_request(request.request_id).num_tokens - 1) // self._block_size

    def cached_run(self, request: Request, keys: list[Any], start: int = 0) -> int:
        if not keys:
            return start
        handle = self._vllm_request(request.request_id)
        _, tokens, *_ = self._manager.coordinator.find_longest_cache_hit(
            handle.block_hashes, handle.num_tokens - 1
        )
        return min(len(keys), tokens // self._block_size)

    def want(self, keys: list[Any]) -> None:
        """vLLM's cache evicts by its own rule: nothing to tell it."""

    def unwant(self, keys: list[Any]) -> None:
        """See `want`."""
