"""vLLM's own prefix cache as tokenfair's locality-aware policies see it.

`vtc-lpm` and `dlpm` order waiting requests by how much of their prompt is cached
(core/prefix_cache.py). Inside vLLM that is vLLM's cache: this view answers the
policy's questions from a `CacheAccess`, which the scheduler module builds over vLLM's
KV cache manager (that module holds every line that touches vLLM; this one imports
nothing of it):

- a waiting request's block hashes and length are vLLM's, found by request id;
- how much of a request is cached: vLLM's own lookup, without side effects;
- a block becoming findable: the access calls `blocks_cached` with the hashes it
  cached (a waiting request sharing them sees its prefix grow);
- an eviction: the access calls `block_evicted`. vLLM evicts as it likes, so every
  eviction counts as one the policy may care about, and a policy checks its choice
  again after any (`want`/`unwant` do nothing here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tokenfair.core.policies.view import RequestView


class CacheAccess(Protocol):
    """What the view needs of vLLM's KV cache manager, by request id."""

    enabled: bool

    def block_hashes(self, request_id: str) -> Sequence[Any]: ...

    def num_tokens(self, request_id: str) -> int: ...

    def cached_tokens(self, request_id: str) -> int: ...

    def follow(self, cached: Callable[[list[Any]], None], evicted: Callable[[], None]) -> None:
        """Call `cached(hashes)` as blocks become findable and `evicted()` per eviction."""


class VllmPrefixCache:
    """The `PrefixCache` view of a vLLM scheduler's KV cache."""

    def __init__(self, access: CacheAccess, block_size: int) -> None:
        self.enable_prefix_caching = bool(access.enabled)
        self.on_cached: list[Callable[[list[Any]], None]] = []
        self.wanted_evictions = 0
        self._access = access
        self._block_size = block_size
        if self.enable_prefix_caching:
            access.follow(self._blocks_cached, self._block_evicted)

    def _blocks_cached(self, keys: list[Any]) -> None:
        for listener in self.on_cached:
            listener(keys)

    def _block_evicted(self) -> None:
        self.wanted_evictions += 1

    def block_hashes(self, request: RequestView, count: int) -> list[Any]:
        return list(self._access.block_hashes(request.request_id)[:count])

    def matchable_blocks(self, request: RequestView) -> int:
        # At least one token is always computed, as vLLM's own lookup requires.
        return max(0, self._access.num_tokens(request.request_id) - 1) // self._block_size

    def cached_run(self, request: RequestView, keys: list[Any], start: int = 0) -> int:
        if not keys:
            return start
        tokens = self._access.cached_tokens(request.request_id)
        return min(len(keys), tokens // self._block_size)

    def wanted_evicted_since(self, count: int) -> list[Any] | None:
        """vLLM does not say which block it evicted: a request is walked again."""
        return None

    def want(self, keys: list[Any]) -> None:
        """vLLM's cache evicts by its own rule: nothing to tell it."""

    def unwant(self, keys: list[Any]) -> None:
        """See `want`."""
