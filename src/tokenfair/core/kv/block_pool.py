"""The device block pool: which blocks are held, by how many requests, and by whom.

A block is in exactly one of three places: held (reference count > 0, in some
requests' block tables), free and untouched (`_free`), or idle (nobody holds it, but
it keeps cached contents and waits in an LRU to be found again or evicted). Idle
blocks that a waiting request will hit wait in a second LRU, evicted only once the
first is empty (`want`/`unwant`). Fresh blocks come from the untouched ones first,
then from the oldest idle one; the prefix index is told of each eviction.

The pool also knows what each tenant holds: the number of distinct blocks its requests
reference (a block two of its requests share counts once). That is what memory is
shared by (the scheduler's memory share: docs/fairness.md, "What a tenant holds").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self.ref_count = [0] * num_blocks
        # Idle cached blocks, oldest first: nobody waiting wants these...
        self._idle: OrderedDict[int, None] = OrderedDict()
        # ...and these, some waiting request will hit: evicted last.
        self._idle_wanted: OrderedDict[int, None] = OrderedDict()
        # tenant -> block -> how many of the tenant's requests hold it.
        self._held: dict[str, dict[int, int]] = {}
        # Told each idle block that is evicted to be reused (the prefix index forgets it).
        self.on_evict: Callable[[int], None] = lambda block: None

    # --- capacity ---
    @property
    def num_free(self) -> int:
        """Blocks a request may take: untouched and idle ones."""
        return len(self._free) + len(self._idle) + len(self._idle_wanted)

    def held_by(self, tenant: str) -> int:
        """Distinct blocks the tenant's requests hold."""
        held = self._held.get(tenant)
        return len(held) if held else 0

    def holdings(self) -> dict[str, int]:
        """Tenant -> distinct blocks held, for every tenant holding any."""
        return {tenant: len(blocks) for tenant, blocks in self._held.items() if blocks}

    # --- taking and releasing ---
    def take_fresh(self, tenant: str) -> int:
        """A block with no contents, held once by `tenant` (the caller checked `num_free`)."""
        if self._free:
            block = self._free.pop()
        else:
            lru = self._idle or self._idle_wanted  # least recently freed, unwanted first
            block, _ = lru.popitem(last=False)
            self.on_evict(block)
        self.ref_count[block] = 1
        held = self._held.get(tenant)
        if held is None:
            held = self._held[tenant] = {}
        held[block] = 1
        return block

    def take(self, block: int, tenant: str) -> None:
        """One more hold on a cached block (a prefix hit), idle or held."""
        if self.ref_count[block] == 0:
            if block in self._idle:
                del self._idle[block]
            else:
                del self._idle_wanted[block]
        self.ref_count[block] += 1
        held = self._held.get(tenant)
        if held is None:
            held = self._held[tenant] = {}
        held[block] = held.get(block, 0) + 1

    def release(self, blocks: list[int], tenant: str, cached: Callable[[int], int]) -> None:
        """Drop one hold on each block; a block nobody holds any more becomes free, or
        idle in its LRU when `cached(block)` says it keeps findable contents (1: plain,
        2: wanted; 0: not cached). The last block first, so that the LRU evicts a
        request's last blocks before its first."""
        ref_count, held = self.ref_count, self._held[tenant]
        for block in reversed(blocks):
            refs = held[block] - 1
            if refs:
                held[block] = refs
            else:
                del held[block]
            ref_count[block] -= 1
            if ref_count[block] == 0:
                kind = cached(block)
                if kind == 0:
                    self._free.append(block)
                elif kind == 2:
                    self._idle_wanted[block] = None
                else:
                    self._idle[block] = None
        if not held:
            del self._held[tenant]

    # --- the idle blocks' order ---
    def is_idle(self, block: int) -> bool:
        return self.ref_count[block] == 0 and (block in self._idle or block in self._idle_wanted)

    def touch(self, block: int) -> None:
        """Make an idle block the most recently used in the LRU it waits in."""
        if block in self._idle:
            self._idle.move_to_end(block)
        elif block in self._idle_wanted:
            self._idle_wanted.move_to_end(block)

    def mark_wanted(self, block: int, wanted: bool) -> None:
        """Move an idle block to the LRU of wanted blocks, or back (no-op if held)."""
        source, target = (
            (self._idle, self._idle_wanted) if wanted else (self._idle_wanted, self._idle)
        )
        if block in source:
            del source[block]
            target[block] = None

    # --- invariants, for tests and debugging ---
    def check_invariants(self, tables: list[list[int]], wanted: Callable[[int], bool]) -> None:
        held: dict[int, int] = {}
        for table in tables:
            for block in table:
                held[block] = held.get(block, 0) + 1
        for block in range(self.num_blocks):
            assert self.ref_count[block] == held.get(block, 0), f"block {block} ref count"
        free = set(self._free) | set(self._idle) | set(self._idle_wanted)
        assert len(free) == self.num_free, "block free twice"
        for block in self._idle_wanted:
            assert wanted(block), "an unwanted block kept"
        assert not free & set(held), "a held block is also free"
        assert len(free) + len(held) == self.num_blocks, "blocks leaked"
        by_tenant = {block for blocks in self._held.values() for block in blocks}
        assert by_tenant == set(held), "a tenant's holdings disagree with the tables"
