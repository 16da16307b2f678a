"""What a locality-aware policy sees of the prefix cache, and how it follows it.

`PrefixCache` is the view: a request's chain of block hashes, whether a block is
cached, the blocks waiting requests want, and two signals of change (listeners told
of every block that becomes findable, and a count of wanted blocks evicted). The core's KVCacheManager is one; a driver with
a cache of its own (vLLM's) can provide another.

`CachedPrefixIndex` keeps, for every waiting request a policy tracks, how many leading
blocks of it are cached, without walking every waiting request at every step (and
tells the cache which blocks those requests want, so it evicts them last):
- growth is pushed: a request waits on the one hash that would extend its match (its
  next block); when that block is cached, the index extends the match and tells the
  policy, which re-files the request;
- shrinkage is pulled: every block of a tracked match is wanted, so only the eviction
  of a wanted block can shorten one, and `verify` checks a request again when wanted
  blocks were evicted since its last check. A policy ordering by the
  estimate verifies its choice before taking it; since estimates never understate,
  the first choice that verifies is the true longest.

A check looks only at the blocks evicted since the last one, when the cache names them
(`wanted_evicted_since`): the match now ends at the first of them in it that is still
not cached, and every block before that one is cached as it was. On a pool too small
for every tenant's prefix, a few blocks of one prefix are evicted at a time while many
requests wait on it, so this is what keeps a check from costing the whole prefix.
Without the names (vLLM's cache) the request is walked again from its first block.
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


class _Tracked:
    __slots__ = ("blocks", "hashes", "place", "request", "waits_on", "walked_at")

    def __init__(self, request: RequestView) -> None:
        self.request = request
        self.hashes: list[int] = []  # its matchable blocks' chain hashes
        self.blocks = 0  # cached leading blocks, as last seen
        self.walked_at = -1  # the cache's wanted evictions at the last check from block 0
        self.waits_on: int | None = None  # the hash that would extend the match
        # hash -> its first place in `hashes`, made at the first check that needs it
        self.place: dict[int, int] | None = None


class CachedPrefixIndex:
    """The cached-prefix length of each tracked request, kept current (see module doc)."""

    def __init__(self, on_grow: Callable[[RequestView], None]) -> None:
        self._on_grow = on_grow
        self._cache: PrefixCache | None = None
        self._tracked: dict[str, _Tracked] = {}
        # hash -> the tracked requests whose match that block would extend, by id
        self._waiting_on: dict[int, dict[str, _Tracked]] = {}

    def attach(self, cache: PrefixCache) -> None:
        if cache.enable_prefix_caching:
            self._cache = cache
            cache.on_cached.append(self._blocks_cached)

    @property
    def wanted_evictions(self) -> int:
        """The cache's count of evicted wanted blocks (0 without a cache)."""
        return self._cache.wanted_evictions if self._cache is not None else 0

    def track(self, request: RequestView) -> None:
        if self._cache is None:
            return
        entry = self._tracked[request.request_id] = _Tracked(request)
        self._walk(entry, 0)

    def untrack(self, request: RequestView) -> None:
        entry = self._tracked.pop(request.request_id, None)
        if entry is not None:
            self._stop_waiting(entry)
            self._set_blocks(entry, 0)

    def _set_blocks(self, entry: _Tracked, blocks: int) -> None:
        """Record the entry's match, telling the cache which blocks it now wants."""
        cache = self._cache
        assert cache is not None
        before = entry.blocks
        if blocks != before:
            hashes = entry.hashes
            if blocks > before:
                cache.want(hashes[before:blocks])
            else:
                cache.unwant(hashes[blocks:before])
            entry.blocks = blocks

    def _stop_waiting(self, entry: _Tracked) -> None:
        if entry.waits_on is None:
            return
        bucket = self._waiting_on.get(entry.waits_on)
        if bucket is not None:
            bucket.pop(entry.request.request_id, None)
            if not bucket:
                del self._waiting_on[entry.waits_on]
        entry.waits_on = None

    def blocks(self, request: RequestView) -> int:
        """The request's cached leading blocks, as last seen (never an understatement)."""
        entry = self._tracked.get(request.request_id)
        return 0 if entry is None else entry.blocks

    def verify(self, request: RequestView) -> bool:
        """Check the request's match again if wanted blocks were evicted since the last
        check; False if it shrank."""
        entry = self._tracked.get(request.request_id)
        cache = self._cache
        if entry is None or cache is None:
            return True
        evictions = cache.wanted_evictions
        if entry.walked_at == evictions:
            return True
        before = entry.blocks
        evicted = cache.wanted_evicted_since(entry.walked_at)
        if evicted is None or len(evicted) >= before:
            self._walk(entry, 0)  # as cheap as looking at the evictions, or unknown
            return entry.blocks == before
        entry.walked_at = evictions
        place = entry.place
        if place is None:
            hashes = entry.hashes
            # The first place of a hash wins, as in a walk.
            place = entry.place = dict(
                zip(reversed(hashes), range(len(hashes) - 1, -1, -1), strict=True)
            )
        # Blocks of the match not evicted since the last check are cached still: the
        # match holds up to the first of those evicted, and is walked on from there.
        first = before
        for key in evicted:
            at = place.get(key, before)
            if at < first:
                first = at
        if first == before:
            return True
        self._walk(entry, first)
        return entry.blocks == before

    def _walk(self, entry: _Tracked, start: int) -> None:
        cache = self._cache
        assert cache is not None
        request = entry.request
        hashes = cache.block_hashes(request, cache.matchable_blocks(request))
        if len(hashes) != len(entry.hashes):
            entry.place = None
        entry.hashes = hashes
        blocks = cache.cached_run(request, hashes, start)
        self._set_blocks(entry, blocks)
        if start == 0:
            entry.walked_at = cache.wanted_evictions
        waits_on = hashes[blocks] if blocks < len(hashes) else None
        if waits_on != entry.waits_on:
            self._stop_waiting(entry)
            if waits_on is not None:
                self._waiting_on.setdefault(waits_on, {})[request.request_id] = entry
                entry.waits_on = waits_on

    def _blocks_cached(self, keys: list[int]) -> None:
        waiting_on = self._waiting_on
        for key in keys:
            waiting = waiting_on.pop(key, None)
            if not waiting:
                continue
            for entry in waiting.values():
                entry.waits_on = None  # its bucket is gone
                self._walk(entry, entry.blocks)
                self._on_grow(entry.request)


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
