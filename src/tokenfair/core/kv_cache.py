"""Paged KV cache bookkeeping: which blocks each request holds, on device and in swap.

The pool is `num_blocks` blocks of `block_size` token slots. A request's block table
lists its blocks in token order; token p lives in block_table[p // block_size].

`KVCacheManager` is the scheduler's one door to KV memory, over three owners (core/kv/):
the block pool (reference counts, free and idle blocks, what each tenant holds), the
prefix index (chain hashes, wanted hashes) and the swap area.

Prefix caching: a full block's contents are fixed, so it is entered in the prefix index
under a hash chained from its predecessor's. When its owner frees it, the block keeps
its contents and its hash and waits idle in an LRU; a later request whose tokens hash
the same (typically a recomputed request re-prefilling its own tokens) takes it back
instead of recomputing it. Blocks that a waiting request will hit can be marked
wanted: they wait in a second LRU that is evicted only once the first is empty, so a
backlogged tenant's prefix is not evicted to make room for blocks nobody will read
again (locality-aware policies mark them; docs/fairness.md).

Admission looks before it takes: `lookup_prefix` finds a waiting request's cached
prefix and changes nothing (no reference counts, no LRU order); `allocate` then takes
that prefix and the new blocks together, or nothing when the pool is short. A head of
the queue that cannot be admitted yet has its idle prefix blocks made the most recently
used (`touch_prefix`): it is next in line, so they are evicted after the other idle ones.

What each tenant holds (`held_by`, `holdings`: distinct blocks) is what the scheduler
shares memory by (docs/fairness.md, "What a tenant holds").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from tokenfair.core.kv.block_pool import BlockPool
from tokenfair.core.kv.prefix_index import PrefixIndex
from tokenfair.core.kv.swap_area import SwapArea
from tokenfair.core.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks of `block_size` tokens that hold `num_tokens` tokens (the one rounding rule)."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """A waiting request's cached prefix as `KVCacheManager.lookup_prefix` found it.

    Nothing is taken by the lookup: pass the hit to `allocate` to take it, in the same
    step (`allocate` checks that the blocks still hold these hashes and refuses a stale
    hit with ValueError).
    """

    blocks: tuple[int, ...]  # the cached blocks, in token order
    hashes: tuple[int, ...]  # their chain hashes (the cache's keys), one per block
    num_tokens: int  # tokens they hold: the request's computed tokens once taken
    # How many of them nobody holds now (idle): taking the prefix takes that many
    # blocks from the free pool.
    idle_blocks: int


NO_PREFIX = PrefixHit((), (), 0, 0)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        num_swap_blocks: int = 0,
        enable_prefix_caching: bool = False,
    ):
        if num_blocks < 1 or block_size < 1 or num_swap_blocks < 0:
            raise ValueError("num_blocks and block_size must be >= 1, num_swap_blocks >= 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_swap_blocks = num_swap_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.index = PrefixIndex(num_blocks, block_size)
        self.swap = SwapArea(num_swap_blocks)
        self.pool.on_evict = self.index.forget
        # The pool's own lists and dict (never replaced), for allocate's hot path.
        pool = self.pool
        self._untouched, self._ref_count = pool._free, pool.ref_count
        self._owner, self._held = pool._owner, pool._held
        # request id -> its block table; read it through `block_table`.
        self._tables: dict[str, list[int]] = {}
        # The request's blocks in token order (KeyError if it holds none: see `holders`):
        # the manager's own list, which grows in place as the request does; read it,
        # never change it. A bound dict lookup, since the scheduler reads every running
        # request's table at every step.
        self.block_table: Callable[[str], list[int]] = self._tables.__getitem__
        self.block_hashes = self.index.block_hashes
        self.matchable_blocks = self.index.matchable_blocks
        self.on_cached = self.index.on_cached
        self.wanted_evicted_since = self.index.wanted_evicted_since
        self.prefix_hit_tokens = 0  # totals, for metrics
        self.prefix_query_tokens = 0

    # --- capacity ---
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free

    @property
    def num_free_swap_blocks(self) -> int:
        return self.swap.num_free

    @property
    def swap_tables(self) -> dict[str, list[int]]:
        return self.swap.tables

    @property
    def wanted_evictions(self) -> int:
        return self.index.wanted_evictions

    def held_by(self, tenant: str) -> int:
        """Distinct blocks the tenant's requests hold on the device."""
        return self.pool.held_by(tenant)

    def holdings(self) -> dict[str, int]:
        """Tenant -> distinct device blocks held, for every tenant holding any."""
        return self.pool.holdings()

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens (see `blocks_for`)."""
        return blocks_for(num_tokens, self.block_size)

    def blocks_needed(self, request: Request, num_tokens: int) -> int:
        """Blocks `request` must add to hold `num_tokens` tokens in total."""
        have = len(self._tables.get(request.request_id, ()))
        return max(0, self.blocks_for(num_tokens) - have)

    # --- block tables (and `block_table`, set in __init__) ---
    def holders(self) -> list[str]:
        """The ids of the requests that hold a block table (possibly an empty one)."""
        return list(self._tables)

    # --- allocation ---
    def allocate(
        self, request: Request, num_tokens: int, prefix: PrefixHit | None = None
    ) -> list[int] | None:
        """Grow the request's table to hold `num_tokens` tokens; None if the pool is short.

        With `prefix` (a hit from `lookup_prefix`, for a request that holds no blocks
        yet) its cached blocks are taken first and the new blocks follow them; the
        prefix's idle blocks count against the free pool like new ones. All or nothing:
        the whole table on success (the manager's own list, see `block_table`; test it
        with `is None`, as an empty table is falsy), None and nothing taken on
        shortage. The one place that decides whether blocks are available: the
        scheduler preempts or stops admitting on None.
        """
        if prefix is not None and prefix.blocks:
            return self._allocate_with_prefix(request, num_tokens, prefix)
        # Runs for every growing request at every step: kept plain.
        table = self._tables.get(request.request_id)
        need = -(-num_tokens // self.block_size) - (len(table) if table is not None else 0)
        if need <= 0:
            if table is None:
                table = self._tables[request.request_id] = []
            return table
        if need == 1 and table is not None and self._untouched:
            # The usual growth by one untouched block, BlockPool.take_fresh's fast path
            # written out here: with one-token blocks it runs once per token.
            block = self._untouched.pop()
            self._ref_count[block] = 1
            self._owner[block] = tenant = request.client
            self._held[tenant] = self._held.get(tenant, 0) + 1
            table.append(block)
            return table
        blocks = self.pool.take_fresh(need, request.client)
        if blocks is None:
            return None
        if table is None:
            self._tables[request.request_id] = blocks
            return blocks
        table += blocks
        return table

    def _allocate_with_prefix(
        self, request: Request, num_tokens: int, prefix: PrefixHit
    ) -> list[int] | None:
        if self._tables.get(request.request_id):
            raise ValueError(
                f"request {request.request_id!r} holds blocks: a cached prefix is taken "
                "only by a request that holds none"
            )
        pool, block_hash = self.pool, self.index.block_hash
        idle = 0
        for block, key in zip(prefix.blocks, prefix.hashes, strict=True):
            if block_hash[block] != key:
                raise ValueError(
                    f"stale prefix hit for request {request.request_id!r}: block {block} "
                    "was evicted since the lookup; look the prefix up again"
                )
            if pool.ref_count[block] == 0:
                idle += 1
        need = max(0, self.blocks_for(num_tokens) - len(prefix.blocks))
        if need + idle > pool.num_free:
            return None
        tenant = request.client
        for block in prefix.blocks:
            pool.take(block, tenant)
        table = self._tables[request.request_id] = list(prefix.blocks)
        self.index.entered_blocks[request.request_id] = len(table)
        if need:  # fits: checked above, with the prefix's blocks out of the LRU now
            table += pool.take_fresh(need, tenant) or ()
        return table

    def free(self, request: Request) -> None:
        """Release every block of the request (finished, aborted or preempted)."""
        table = self._tables.pop(request.request_id, None)
        self.index.entered_blocks.pop(request.request_id, None)
        if table:
            index = self.index
            self.pool.release(table, request.client, index.block_hash, index.wanted)

    # --- prefix caching ---
    def cached_run(self, request: Request, keys: list[int], start: int = 0) -> int:
        """`start` plus how many of `keys` (the request's block hashes) from `start` on
        are cached one after another."""
        return self.index.cached_run(keys, start)

    def cached_prefix_blocks(self, request: Request) -> int:
        """How many leading blocks of the request are in the cache now (nothing taken)."""
        if not self.enable_prefix_caching:
            return 0
        index = self.index
        return index.cached_run(index.block_hashes(request, index.matchable_blocks(request)))

    def lookup_prefix(self, request: Request) -> PrefixHit:
        """The request's longest cached prefix; nothing is taken and nothing in the cache
        changes (no reference counts, no LRU order). Take it with `allocate`."""
        if not self.enable_prefix_caching:
            return NO_PREFIX
        index = self.index
        keys = index.block_hashes(request, index.matchable_blocks(request))
        # In C, block by block: a waiting request's prefix is looked up at every step it
        # is tried, and a cached prompt is a few hundred blocks.
        found: list[int | None] = list(map(index.cached.get, keys))
        if None in found:
            del found[found.index(None) :]
        if not found:
            return NO_PREFIX
        blocks = cast("list[int]", found)
        count = len(blocks)
        idle = list(map(self.pool.ref_count.__getitem__, blocks)).count(0)
        return PrefixHit(tuple(blocks), tuple(keys[:count]), count * self.block_size, idle)

    def touch_prefix(self, hit: PrefixHit) -> None:
        """Make the hit's idle blocks the most recently used, its first block last (as
        if its request had taken and freed them), each in the LRU it waits in; nothing
        is taken. For a waiting request that is next in line but not admitted yet."""
        pool = self.pool
        for block in reversed(hit.blocks):
            if pool.ref_count[block] == 0:
                pool.touch(block)

    def want(self, keys: list[int]) -> None:
        """A waiting request will hit these blocks: evict them last."""
        for block in self.index.want(keys):
            self.pool.mark_wanted(block, True)

    def unwant(self, keys: list[int]) -> None:
        """Undo `want` (the request was admitted, dropped, or its match shrank)."""
        for block in self.index.unwant(keys):
            self.pool.mark_wanted(block, False)

    def count_prefix_query(self, hit_tokens: int, total_tokens: int) -> None:
        """Record an admitted request's prefix-cache hit, for hit-rate metrics."""
        if self.enable_prefix_caching:
            self.prefix_hit_tokens += hit_tokens
            self.prefix_query_tokens += total_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Enter the blocks that the request's computed tokens have filled in the cache."""
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request.request_id)
        if table:
            self.index.enter(request, table)

    # --- swap ---
    def can_swap_out(self, request: Request) -> bool:
        return self.swap.can_hold(len(self._tables.get(request.request_id, ())))

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the swap area: (device, swap) copies, or None if full."""
        if not self.can_swap_out(request):
            return None
        table = self._tables.get(request.request_id, [])
        swap_table = self.swap.put(request.request_id, len(table))
        mapping = list(zip(table, swap_table, strict=True))
        self.free(request)
        return mapping

    def swap_in(self, request: Request, num_tokens: int = 0) -> list[tuple[int, int]] | None:
        """Bring the request's blocks back and grow them to hold `num_tokens` tokens.

        Returns the (swap, device) copies, or None (nothing moved) if the pool cannot
        hold the swapped blocks plus the growth.
        """
        swap_table = self.swap.tables.get(request.request_id)
        if swap_table is None:
            return None
        if max(len(swap_table), self.blocks_for(num_tokens)) > self.pool.num_free:
            return None
        self.swap.drop(request.request_id)
        table = self.pool.take_fresh(len(swap_table), request.client) or []  # fits
        self._tables[request.request_id] = table
        copies = list(zip(swap_table, table, strict=True))
        self.allocate(request, num_tokens)  # fits: checked above
        return copies

    def free_swap(self, request: Request) -> None:
        self.swap.drop(request.request_id)

    # --- invariants, for tests and debugging ---
    def check_invariants(self) -> None:
        self.pool.check_invariants(list(self._tables.values()), self.index.is_wanted)
        self.swap.check_invariants()
