"""Paged KV cache bookkeeping: which blocks each request holds, on device and in swap.

The pool is `num_blocks` blocks of `block_size` token slots. A request's block table
lists its blocks in token order; token p lives in block_table[p // block_size].

Prefix caching: once a block is full its contents are fixed, so it gets a hash chained
from its predecessor's. When its owner frees it, the block keeps its contents and its
hash and waits in an LRU of evictable blocks; a later request whose tokens hash the
same (typically a recomputed request re-prefilling its own tokens) takes it back
instead of recomputing it. Fresh blocks come from untouched free blocks first, then
from the LRU's oldest end.

Requests without token ids (the simulator's) hash their blocks by request id and
position, so a recomputed simulated request still hits its own old blocks.

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

from tokenfair.core.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks of `block_size` tokens that hold `num_tokens` tokens (the one rounding rule)."""
    return -(-num_tokens // block_size)


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
        self.block_tables: dict[str, list[int]] = {}
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self._ref_count = [0] * num_blocks
        # Prefix cache: hash of each full block (or None), hash -> block, evictable LRU.
        self._block_hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # block ids, oldest first
        # request id -> (how many leading blocks are hashed, the chain hash after them)
        self._hashed_blocks: dict[str, tuple[int, int]] = {}
        # Swap area.
        self._swap_free: list[int] = list(range(num_swap_blocks - 1, -1, -1))
        self.swap_tables: dict[str, list[int]] = {}
        self.prefix_hit_tokens = 0  # totals, for metrics
        self.prefix_query_tokens = 0

    # --- capacity ---
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

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
        have = len(self.block_tables.get(request.request_id, ()))
        return max(0, self.blocks_for(num_tokens) - have)

    # --- allocation ---
    def allocate(self, request: Request, num_tokens: int) -> bool:
        """Grow the request's table to hold `num_tokens` tokens; False if the pool is short.

        The one place that decides whether blocks are available: the scheduler asks
        here and preempts or stops admitting on False. Nothing is taken on False.
        """
        table = self.block_tables.get(request.request_id)
        need = self.blocks_for(num_tokens) - (len(table) if table is not None else 0)
        if need > self.num_free_blocks:
            return False
        if table is None:
            table = self.block_tables[request.request_id] = []
        if need <= 0:
            return True
        ref_count = self._ref_count
        for _ in range(need):
            block = self._free.pop() if self._free else self._take_free_block()
            ref_count[block] = 1
            table.append(block)
        return True

    def _take_free_block(self) -> int:
        if self._free:
            return self._free.pop()
        block, _ = self._evictable.popitem(last=False)  # evict the least recently freed
        key = self._block_hash[block]
        assert key is not None  # evictable blocks are the hashed ones
        del self._cached[key]
        self._block_hash[block] = None
        return block

    def free(self, request: Request) -> None:
        """Release every block of the request (finished, aborted or preempted)."""
        table = self.block_tables.pop(request.request_id, None)
        self._hashed_blocks.pop(request.request_id, None)
        if not table:
            return
        ref_count, block_hash = self._ref_count, self._block_hash
        # Free the tail first so the LRU evicts a request's last blocks before its first.
        for block in reversed(table):
            ref_count[block] -= 1
            if ref_count[block] == 0:
                if block_hash[block] is None:
                    self._free.append(block)
                else:
                    self._evictable[block] = None

    # --- prefix caching ---
    def _chain_hash(
        self, parent: int, request: Request, index: int, tokens: list[int] | None
    ) -> int:
        """The hash of block `index` given its predecessor's (0 for the first block)."""
        if tokens is None:
            return hash((parent, (request.request_id, index)))
        size = self.block_size
        digest = hashlib.sha256(parent.to_bytes(32, "big"))
        if parent == 0 and request.cache_salt is not None:
            salt = request.cache_salt.encode("utf-8")
            digest.update(len(salt).to_bytes(4, "big") + salt)
        digest.update(array("q", tokens[index * size : (index + 1) * size]).tobytes())
        return int.from_bytes(digest.digest(), "big")

    def match_prefix(self, request: Request) -> int:
        """Take the request's longest cached prefix; return how many tokens it covers.

        Called on admission when the request holds no blocks. At least one token is
        always left to compute, since the forward pass must produce the next token.
        """
        if not self.enable_prefix_caching:
            return 0
        assert request.request_id not in self.block_tables
        tokens = request.all_token_ids()
        max_blocks = (request.num_tokens - 1) // self.block_size
        table: list[int] = []
        parent = 0
        for index in range(max_blocks):
            parent = self._chain_hash(parent, request, index, tokens)
            block = self._cached.get(parent)
            if block is None:
                break
            if self._ref_count[block] == 0:
                del self._evictable[block]
            self._ref_count[block] += 1
            table.append(block)
        # The chain hash after the last hit (not `parent`, which may be the miss's).
        parent = (self._block_hash[table[-1]] or 0) if table else 0
        self.block_tables[request.request_id] = table
        self._hashed_blocks[request.request_id] = (len(table), parent)
        return len(table) * self.block_size

    def count_prefix_query(self, hit_tokens: int, total_tokens: int) -> None:
        """Record an admitted request's prefix-cache hit, for hit-rate metrics."""
        if self.enable_prefix_caching:
            self.prefix_hit_tokens += hit_tokens
            self.prefix_query_tokens += total_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Hash the request's blocks that its computed tokens have filled."""
        if not self.enable_prefix_caching:
            return
        table = self.block_tables.get(request.request_id)
        if not table:
            return
        done, parent = self._hashed_blocks.get(request.request_id, (0, 0))
        full = min(request.num_computed_tokens // self.block_size, len(table))
        if full <= done:
            return
        tokens = request.all_token_ids()
        for index in range(done, full):
            # The chain continues through every block, cached here or not, so later
            # blocks of this request stay findable.
            parent = self._chain_hash(parent, request, index, tokens)
            block = table[index]
            if parent in self._cached:
                # Same content already cached elsewhere (computed twice concurrently);
                # keep this block private rather than aliasing it.
                continue
            self._block_hash[block] = parent
            self._cached[parent] = block
        self._hashed_blocks[request.request_id] = (full, parent)

    # --- swap ---
    def can_swap_out(self, request: Request) -> bool:
        return len(self.block_tables.get(request.request_id, ())) <= len(self._swap_free)

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the swap area: (device, swap) copies, or None if full."""
        if not self.can_swap_out(request):
            return None
        table = self.block_tables.get(request.request_id, [])
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
        self.block_tables[request.request_id] = table
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
        for table in self.block_tables.values():
            for block in table:
                held[block] = held.get(block, 0) + 1
        for block in range(self.num_blocks):
            assert self._ref_count[block] == held.get(block, 0), f"block {block} ref count"
        free = set(self._free) | set(self._evictable)
        assert len(free) == len(self._free) + len(self._evictable), "block free twice"
        assert not free & set(held), "a held block is also free"
        assert len(free) + len(held) == self.num_blocks, "blocks leaked"
        swapped = [b for t in self.swap_tables.values() for b in t]
        assert len(swapped) + len(self._swap_free) == self.num_swap_blocks, "swap blocks leaked"
