"""The prefix index: which block holds which chain hash, and which hashes are wanted.

Once a block is full its contents are fixed, so it gets a hash chained from its
predecessor's; `lookup` walks a request's chain of hashes through `_cached` (hash ->
block). Each request keeps its chain (`Request.block_hashes`), computed once, since the
locality-aware policies look a waiting request's prefix up at every step.

Token blocks are chained with sha256 (as vLLM does since its prefix-cache collision
advisory: Python's hash of a token tuple can be made to collide), starting from the
request's `cache_salt`, so requests under different salts (tenants) never share a
block: a shared prefix hit would let one tenant time another's prompts. Requests
without token ids (the simulator's) hash their blocks by name: a block on the
request's prefix group's text by (group, position), any other by (request id,
position), so requests of one group share their common prefix and a recomputed
simulated request still hits its own old blocks.

Wanted hashes (`want`/`unwant`, counted per waiting request) are the blocks a waiting
request will hit: the pool evicts them last. The hashes of the wanted blocks evicted
lately are kept in order (`wanted_evicted_since`), so that a waiting request's match is
checked against those evictions alone rather than walked again from its first block.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable

from tokenfair.core.request import Request

# How many of the latest wanted evictions are remembered by hash. A waiting request
# last checked before them is walked again from its first block.
EVICTION_LOG = 4096


class PrefixIndex:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> the block holding it
        self.wanted: dict[int, int] = {}  # hash -> waiting requests that want it
        # request id -> how many of its leading blocks are entered in the index
        self.entered_blocks: dict[str, int] = {}
        # Told the hashes of the blocks that become findable (locality-aware policies).
        self.on_cached: list[Callable[[list[int]], None]] = []
        # Wanted blocks evicted so far: some waiting request's cached prefix shrank.
        self.wanted_evictions = 0
        # The hashes of the latest of them, in order: `_evicted[i]` is eviction number
        # `_evicted_base + i` (counting from 0).
        self._evicted: list[int] = []
        self._evicted_base = 0

    def is_wanted(self, block: int) -> bool:
        return self.block_hash[block] in self.wanted

    def forget(self, block: int) -> None:
        """The pool evicted `block` to reuse it: its contents are gone."""
        key = self.block_hash[block]
        assert key is not None  # idle blocks are the hashed ones
        del self.cached[key]
        self.block_hash[block] = None
        if key in self.wanted:
            self.wanted_evictions += 1
            evicted = self._evicted
            evicted.append(key)
            if len(evicted) > 2 * EVICTION_LOG:
                del evicted[:EVICTION_LOG]
                self._evicted_base += EVICTION_LOG

    def wanted_evicted_since(self, count: int) -> list[int] | None:
        """The hashes of the wanted blocks evicted after the first `count` wanted
        evictions, in order; None when they are no longer all remembered."""
        start = count - self._evicted_base
        if start < 0:
            return None
        return self._evicted[start:]

    # --- hashes ---
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

    def cached_run(self, keys: list[int], start: int = 0) -> int:
        """`start` plus how many of `keys` from `start` on are cached one after another."""
        cached, end = self.cached, len(keys)
        while start < end and keys[start] in cached:
            start += 1
        return start

    # --- entering blocks ---
    def enter(self, request: Request, table: list[int]) -> None:
        """Enter the blocks that the request's computed tokens have filled."""
        done = self.entered_blocks.get(request.request_id, 0)
        full = min(request.num_computed_tokens // self.block_size, len(table))
        if full <= done:
            return
        hashes = self.block_hashes(request, full)
        cached, block_hash = self.cached, self.block_hash
        entered = []
        for index in range(done, full):
            key = hashes[index]
            if key in cached:
                # Same content already cached elsewhere (computed twice concurrently);
                # keep this block private rather than aliasing it.
                continue
            block = table[index]
            block_hash[block] = key
            cached[key] = block
            entered.append(key)
        self.entered_blocks[request.request_id] = full
        if entered:
            # Told once for the whole run of blocks: a request waiting on the first
            # then finds the rest cached too.
            for listener in self.on_cached:
                listener(entered)

    # --- wanted hashes ---
    def want(self, keys: list[int]) -> list[int]:
        """Count one more waiting request wanting each key; return the cached blocks
        that became wanted."""
        wanted, cached, became = self.wanted, self.cached, []
        for key in keys:
            count = wanted.get(key, 0)
            wanted[key] = count + 1
            if count == 0 and (block := cached.get(key)) is not None:
                became.append(block)
        return became

    def unwant(self, keys: list[int]) -> list[int]:
        """Undo `want`; return the cached blocks that nobody wants any more."""
        wanted, cached, became = self.wanted, self.cached, []
        for key in keys:
            count = wanted[key] - 1
            if count:
                wanted[key] = count
                continue
            del wanted[key]
            if (block := cached.get(key)) is not None:
                became.append(block)
        return became
