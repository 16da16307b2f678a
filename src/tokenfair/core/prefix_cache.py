"""What a locality-aware policy sees of the prefix cache.

`PrefixCache` is the view: a request's chain of block hashes, whether a block is
cached, the blocks waiting requests want, and two signals of change (listeners told
of every block that becomes findable, and a count of wanted blocks evicted). The core's
KVCacheManager is one (`PrefixCacheView` hands it to a policy); a driver with a cache
of its own (vLLM's) can provide another. How a policy follows the waiting requests'
cached prefixes through it is core/cached_prefix_index.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:  # the policies package imports this module
    from tokenfair.core.kv_cache import KVCacheManager
    from tokenfair.core.policies.view import RequestView
    from tokenfair.core.request import Request


class PrefixCache(Protocol):
    enable_prefix_caching: bool
    # Called with the hashes of the blocks that become findable, a run at a time.
    on_cached: list[Callable[[list[int]], None]]

    @property
    def wanted_evictions(self) -> int:
        """How many wanted blocks were evicted so far (a tracked match may have shrunk)."""
        ...

    def block_hashes(self, request: RequestView, count: int) -> list[int]:
        """The chain hashes of the request's first `count` blocks."""
        ...

    def matchable_blocks(self, request: RequestView) -> int:
        """How many leading blocks of the request a cache hit may cover."""
        ...

    def cached_run(self, request: RequestView, keys: list[int], start: int = 0) -> int:
        """How many of the request's leading blocks are cached: `start` (known to be)
        plus how many of `keys` (its block hashes) from there on are, in a row."""
        ...

    def wanted_evicted_since(self, count: int) -> list[int] | None:
        """The hashes of the wanted blocks evicted after the first `count` wanted
        evictions, in order; None when the cache cannot say (not kept that long, or
        not known)."""
        ...

    def want(self, keys: list[int]) -> None:
        """A waiting request will hit these blocks (a cache may evict them last)."""
        ...

    def unwant(self, keys: list[int]) -> None:
        """Undo `want`."""
        ...


class PrefixCacheView:
    """The `PrefixCache` a scheduler hands its policy over its own KV cache manager:
    lookups, the signals of change and the retention hints, and nothing that takes,
    frees or evicts a block (which stays the scheduler's)."""

    def __init__(self, kv: KVCacheManager) -> None:
        self._kv = kv
        self.enable_prefix_caching = kv.enable_prefix_caching
        self.on_cached = kv.on_cached
        # Bound methods, not wrappers: a locality-aware policy calls these every step.
        # The requests it passes are the scheduler's own, seen as views.
        self.block_hashes = cast("Callable[[RequestView, int], list[int]]", kv.block_hashes)
        self.matchable_blocks = cast("Callable[[RequestView], int]", kv.matchable_blocks)
        self.want = kv.want
        self.unwant = kv.unwant

    @property
    def wanted_evictions(self) -> int:
        return self._kv.wanted_evictions

    def wanted_evicted_since(self, count: int) -> list[int] | None:
        return self._kv.wanted_evicted_since(count)

    def cached_run(self, request: RequestView, keys: list[int], start: int = 0) -> int:
        return self._kv.cached_run(cast("Request", request), keys, start)
