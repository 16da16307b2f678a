"""Paged KV cache bookkeeping: which blocks each request holds, on device and in swap.

The pool is `num_blocks` blocks of `block_size` token slots. A request's block table
lists its blocks in token order; token p lives in block_table[p // block_size].

Prefix caching: once a block is full its contents are fixed, so it gets a hash chained
from its predecessor's. When its owner frees it, the block keeps its contents and its
hash and waits in an LRU of evictable blocks; a later request whose tokens hash the
same (typically a recomputed request re-prefilling its own tokens) takes it back
instead of recomputing it. Fresh blocks come from untouched free blocks first, then
from the LRU's oldest end.

Blocks that a waiting request will hit can be marked wanted (`want`/`unwant`, counted
per waiting request): they wait in a second LRU that is evicted only once the first is
empty, so a backlogged tenant's prefix is not evicted to make room for blocks nobody
will read again (locality-aware policies mark them; docs/fairness.md).

Requests without token ids (the simulator's) hash their blocks by name: a block on
the request's prefix group's text by (group, position), any other by (request id,
position), so requests of one group share their common prefix and a recomputed
simulated request still hits its own old blocks.

Admission looks before it takes: `lookup_prefix` finds a waiting request's cached
prefix and changes nothing (no reference counts, no LRU order); `allocate` then takes
that prefix and the new blocks together, or nothing when the pool is short. A head of
the queue that cannot be admitted yet has its idle prefix blocks made the most recently
used (`touch_prefix`): it is next in line, so they are evicted after the other idle ones.

Each request keeps its chain of block hashes (`Request.block_hashes`), computed once:
a waiting request's cached prefix is looked up at every step by the locality-aware
policies (`cached_prefix_blocks`), which also follow the cache through `on_cached`
listeners (a block became findable) and `wanted_evictions` (how many blocks a waiting
request wanted were evicted).

Token blocks are chained with sha256 (as vLLM does since its prefix-cache collision
advisory: Python's hash of a token tuple can be made to collide), and the chain starts
from the request's `cache_salt`, so requests under different salts (tenants) never
share a block: a shared prefix hit would let one tenant time another's prompts.

The swap area is a second, smaller pool in host memory, bounded by `num_swap_blocks`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

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
    # How many of them nobody holds now (evictable): taking the prefix takes that many
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
        # request id -> its block table; read it through `block_table`.
        self._tables: dict[str, list[int]] = {}
        # The request's blocks in token order (KeyError if it holds none: see `holders`):
        # the manager's own list, which grows in place as the request does; read it,
        # never change it. A bound dict lookup, since the scheduler reads every running
        # request's table at every step.
        self.block_table: Callable[[str], list[int]] = self._tables.__getitem__
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self._ref_count = [0] * num_blocks
        # Prefix cache: hash of each full block (or None), hash -> block, evictable LRU.
        self._block_hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # block ids, oldest first
        # Evictable blocks that some waiting request will hit: evicted last.
        self._evictable_wanted: OrderedDict[int, None] = OrderedDict()
        self._wanted: dict[int, int] = {}  # block hash -> waiting requests that want it
        # request id -> how many of its leading blocks are entered in the cache
        self._hashed_blocks: dict[str, int] = {}
        # Told the hashes of the blocks that become findable (locality-aware policies).
        self.on_cached: list[Callable[[list[int]], None]] = []
        # Wanted blocks evicted so far: some waiting request's cached prefix shrank.
        self.wanted_evictions = 0
        # Swap area.
        self._swap_free: list[int] = list(range(num_swap_blocks - 1, -1, -1))
        self.swap_tables: dict[str, list[int]] = {}
        self.prefix_hit_tokens = 0  # totals, for metrics
        self.prefix_query_tokens = 0

    # --- capacity ---
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable) + len(self._evictable_wanted)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_free_swap_blocks(self) -> int:
        return len(self._swap_free)

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
        table = self._tables.get(request.request_id)
        need = self.blocks_for(num_tokens) - (len(table) if table is not None else 0)
        if need > len(self._free) + len(self._evictable) + len(self._evictable_wanted):
            return None
        if table is None:
            table = self._tables[request.request_id] = []
        if need <= 0:
            return table
        ref_count = self._ref_count
        for _ in range(need):
            block = self._free.pop() if self._free else self._take_free_block()
            ref_count[block] = 1
            table.append(block)
        return table

    def _allocate_with_prefix(
        self, request: Request, num_tokens: int, prefix: PrefixHit
    ) -> list[int] | None:
        if self._tables.get(request.request_id):
            raise ValueError(
                f"request {request.request_id!r} holds blocks: a cached prefix is taken "
                "only by a request that holds none"
            )
        ref_count, block_hash = self._ref_count, self._block_hash
        idle = 0
        for block, key in zip(prefix.blocks, prefix.hashes, strict=True):
            if block_hash[block] != key:
                raise ValueError(
                    f"stale prefix hit for request {request.request_id!r}: block {block} "
                    "was evicted since the lookup; look the prefix up again"
                )
            if ref_count[block] == 0:
                idle += 1
        need = max(0, self.blocks_for(num_tokens) - len(prefix.blocks))
        if need + idle > self.num_free_blocks:
            return None
        for block in prefix.blocks:
            if ref_count[block] == 0:
                if block in self._evictable:
                    del self._evictable[block]
                else:
                    del self._evictable_wanted[block]
            ref_count[block] += 1
        table = self._tables[request.request_id] = list(prefix.blocks)
        self._hashed_blocks[request.request_id] = len(table)
        for _ in range(need):
            block = self._take_free_block()  # the prefix's blocks are out of the LRU now
            ref_count[block] = 1
            table.append(block)
        return table

    def _take_free_block(self) -> int:
        if self._free:
            return self._free.pop()
        # Evict the least recently freed block, one nobody waiting wants if there is one.
        lru = self._evictable or self._evictable_wanted
        block, _ = lru.popitem(last=False)
        key = self._block_hash[block]
        assert key is not None  # evictable blocks are the hashed ones
        del self._cached[key]
        self._block_hash[block] = None
        if key in self._wanted:
            self.wanted_evictions += 1
        return block

    def free(self, request: Request) -> None:
        """Release every block of the request (finished, aborted or preempted)."""
        table = self._tables.pop(request.request_id, None)
        self._hashed_blocks.pop(request.request_id, None)
        if not table:
            return
        ref_count, block_hash, wanted = self._ref_count, self._block_hash, self._wanted
        # Free the tail first so the LRU evicts a request's last blocks before its first.
        for block in reversed(table):
            ref_count[block] -= 1
            if ref_count[block] == 0:
                key = block_hash[block]
                if key is None:
                    self._free.append(block)
                elif key in wanted:
                    self._evictable_wanted[block] = None
                else:
                    self._evictable[block] = None

    # --- prefix caching ---
    def block_hashes(self, request: Request, count: int) -> list[int]:
        """The chain hashes of the request's first `count` blocks (all of them full)."""
        hashes = request.block_hashes
        have = len(hashes)
        if have >= count:
            return hashes if have == count else hashes[:count]
        parent = hashes[-1] if hashes else 0
        tokens = request.all_token_ids()
        if tokens is None:
            # Named blocks: on the group's text up to its shared length, then private.
            size, group, shared = self.block_size, request.prefix_group, request.shared_tokens
            own = request.request_id
            for index in range(have, count):
                name = group if (index + 1) * size <= shared else own
                parent = hash((parent, name, index))
                hashes.append(parent)
            return hashes
        for index in range(have, count):
            parent = self._token_block_hash(parent, request, index, tokens)
            hashes.append(parent)
        return hashes

    def _token_block_hash(
        self, parent: int, request: Request, index: int, tokens: list[int]
    ) -> int:
        """The hash of block `index` of real tokens given its predecessor's (0 first)."""
        size = self.block_size
        digest = hashlib.sha256(parent.to_bytes(32, "big"))
        if parent == 0 and request.cache_salt is not None:
            salt = request.cache_salt.encode("utf-8")
            digest.update(len(salt).to_bytes(4, "big") + salt)
        digest.update(array("q", tokens[index * size : (index + 1) * size]).tobytes())
        return int.from_bytes(digest.digest(), "big")

    def matchable_blocks(self, request: Request) -> int:
        """How many leading blocks of the request a cache hit may cover: all its full
        blocks but the last token's, since the forward pass must produce a token."""
        return (request.num_tokens - 1) // self.block_size

    def cached_run(self, request: Request, keys: list[int], start: int = 0) -> int:
        """`start` plus how many of `keys` (the request's block hashes) from `start` on
        are cached one after another."""
        cached, end = self._cached, len(keys)
        while start < end and keys[start] in cached:
            start += 1
        return start

    def cached_prefix_blocks(self, request: Request) -> int:
        """How many leading blocks of the request are in the cache now (nothing taken)."""
        if not self.enable_prefix_caching:
            return 0
        return self.cached_run(request, self.block_hashes(request, self.matchable_blocks(request)))

    def lookup_prefix(self, request: Request) -> PrefixHit:
        """The request's longest cached prefix; nothing is taken and nothing in the cache
        changes (no reference counts, no LRU order). Take it with `allocate`."""
        if not self.enable_prefix_caching:
            return NO_PREFIX
        cached, ref_count = self._cached, self._ref_count
        keys = self.block_hashes(request, self.matchable_blocks(request))
        blocks: list[int] = []
        idle = 0
        for key in keys:
            block = cached.get(key)
            if block is None:
                break
            blocks.append(block)
            if ref_count[block] == 0:
                idle += 1
        if not blocks:
            return NO_PREFIX
        count = len(blocks)
        return PrefixHit(tuple(blocks), tuple(keys[:count]), count * self.block_size, idle)

    def touch_prefix(self, hit: PrefixHit) -> None:
        """Make the hit's idle blocks the most recently used, its first block last (as
        if its request had taken and freed them), each in the LRU it waits in; nothing
        is taken. For a waiting request that is next in line but not admitted yet."""
        evictable, ref_count = self._evictable, self._ref_count
        for block in reversed(hit.blocks):
            if ref_count[block] == 0:
                if block in evictable:
                    evictable.move_to_end(block)
                else:
                    self._evictable_wanted.move_to_end(block)

    def want(self, keys: list[int]) -> None:
        """A waiting request will hit these blocks: evict them last."""
        wanted = self._wanted
        for key in keys:
            count = wanted.get(key, 0)
            wanted[key] = count + 1
            if count == 0:
                block = self._cached.get(key)
                if block is not None and block in self._evictable:
                    del self._evictable[block]
                    self._evictable_wanted[block] = None

    def unwant(self, keys: list[int]) -> None:
        """Undo `want` (the request was admitted, dropped, or its match shrank)."""
        wanted = self._wanted
        for key in keys:
            count = wanted[key] - 1
            if count:
                wanted[key] = count
                continue
            del wanted[key]
            block = self._cached.get(key)
            if block is not None and block in self._evictable_wanted:
                del self._evictable_wanted[block]
                self._evictable[block] = None

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
        if not table:
            return
        done = self._hashed_blocks.get(request.request_id, 0)
        full = min(request.num_computed_tokens // self.block_size, len(table))
        if full <= done:
            return
        hashes = self.block_hashes(request, full)
        entered = []
        for index in range(done, full):
            key = hashes[index]
            if key in self._cached:
                # Same content already cached elsewhere (computed twice concurrently);
                # keep this block private rather than aliasing it.
                continue
            block = table[index]
            self._block_hash[block] = key
            self._cached[key] = block
            entered.append(key)
        self._hashed_blocks[request.request_id] = full
        if entered:
            # Told once for the whole run of blocks: a request waiting on the first
            # then finds the rest cached too.
            for listener in self.on_cached:
                listener(entered)

    # --- swap ---
    def can_swap_out(self, request: Request) -> bool:
        return len(self._tables.get(request.request_id, ())) <= len(self._swap_free)

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the swap area: (device, swap) copies, or None if full."""
        if not self.can_swap_out(request):
            return None
        table = self._tables.get(request.request_id, [])
        swap_table = [self._swap_free.pop() for _ in table]
        mapping = list(zip(table, swap_table, strict=True))
        self.free(request)
        self.swap_tables[request.request_id] = swap_table
        return mapping

    def swap_in(self, request: Request, num_tokens: int = 0) -> list[tuple[int, int]] | None:
        """Bring the request's blocks back and grow them to hold `num_tokens` tokens.

        Returns the (swap, device) copies, or None (nothing moved) if the pool cannot
        hold the swapped blocks plus the growth.
        """
        swap_table = self.swap_tables.get(request.request_id)
        if swap_table is None:
            return None
        if max(len(swap_table), self.blocks_for(num_tokens)) > self.num_free_blocks:
            return None
        del self.swap_tables[request.request_id]
        table = []
        for _ in swap_table:
            block = self._take_free_block()
            self._ref_count[block] = 1
            table.append(block)
        self._tables[request.request_id] = table
        self._swap_free.extend(reversed(swap_table))
        copies = list(zip(swap_table, table, strict=True))
        self.allocate(request, num_tokens)  # fits: checked above
        return copies

    def free_swap(self, request: Request) -> None:
        swap_table = self.swap_tables.pop(request.request_id, None)
        if swap_table:
            self._swap_free.extend(reversed(swap_table))

    # --- invariants, for tests and debugging ---
    def check_invariants(self) -> None:
        held: dict[int, int] = {}
        for table in self._tables.values():
            for block in table:
                held[block] = held.get(block, 0) + 1
        for block in range(self.num_blocks):
            assert self._ref_count[block] == held.get(block, 0), f"block {block} ref count"
        free = set(self._free) | set(self._evictable) | set(self._evictable_wanted)
        assert len(free) == self.num_free_blocks, "block free twice"
        for block in self._evictable_wanted:
            assert self._block_hash[block] in self._wanted, "an unwanted block kept"
        assert not free & set(held), "a held block is also free"
        assert len(free) + len(held) == self.num_blocks, "blocks leaked"
        swapped = [b for t in self.swap_tables.values() for b in t]
        assert len(swapped) + len(self._swap_free) == self.num_swap_blocks, "swap blocks leaked"
