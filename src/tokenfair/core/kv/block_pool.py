"""The device block pool: which blocks are held, by how many requests, and by whom.

A block is in exactly one of three places: held (reference count > 0, in some
requests' block tables), free and untouched (`_free`), or idle (nobody holds it, but
it keeps cached contents and waits in an LRU to be found again or evicted). Idle
blocks that a waiting request will hit wait in a second LRU, evicted only once the
first is empty (`want`/`unwant`). Fresh blocks come from the untouched ones first,
then from the oldest idle one; the prefix index is told of each eviction.

The pool also knows what each tenant holds: the blocks its requests hold, each block
counted once, for the tenant that took it when nobody held it (a block two requests of
one tenant share counts once; one that requests of several tenants share, possible
only without cache salts, counts for the first). That is what memory is shared by
(the scheduler's memory share: docs/fairness.md, "What a tenant holds").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self.ref_count = [0] * num_blocks
        # Idle cached blocks, oldest first: nobody waiting wants these...
        self._idle: OrderedDict[int, None] = OrderedDict()
        # ...and these, some waiting request will hit: evicted last.
        self._idle_wanted: OrderedDict[int, None] = OrderedDict()
        # The tenant each held block counts for, and how many blocks each tenant holds.
        self._owner: list[str | None] = [None] * num_blocks
        self._held: dict[str, int] = {}
        # Told each idle block that is evicted to be reused (the prefix index forgets it).
        self.on_evict: Callable[[int], None] = lambda block: None

    # --- capacity ---
    @property
    def num_free(self) -> int:
        """Blocks a request may take: untouched and idle ones."""
        return len(self._free) + len(self._idle) + len(self._idle_wanted)

    def held_by(self, tenant: str) -> int:
        """The blocks the tenant's requests hold (see the module docstring)."""
        return self._held.get(tenant, 0)

    def holdings(self) -> dict[str, int]:
        """Tenant -> blocks held, for every tenant holding any."""
        return {tenant: count for tenant, count in self._held.items() if count}

    # --- taking and releasing ---
    def take_fresh(self, count: int, tenant: str) -> list[int] | None:
        """`count` blocks with no contents, held once by `tenant`: untouched ones first,
        then the least recently freed idle ones; None (nothing taken) if too few."""
        free, ref_count, owner, held = self._free, self.ref_count, self._owner, self._held
        if count == 1 and free:  # the usual case: a request grows by one block
            block = free.pop()
            ref_count[block] = 1
            owner[block] = tenant
            held[tenant] = held.get(tenant, 0) + 1
            return [block]
        if count <= len(free):
            blocks = free[len(free) - count :]
            del free[len(free) - count :]
            blocks.reverse()  # as successive pops would give them
        elif count <= len(free) + len(self._idle) + len(self._idle_wanted):
            blocks = [self._evict_or_pop() for _ in range(count)]
        else:
            return None
        for block in blocks:
            ref_count[block] = 1
            owner[block] = tenant
        held[tenant] = held.get(tenant, 0) + count
        return blocks

    def _evict_or_pop(self) -> int:
        if self._free:
            return self._free.pop()
        lru = self._idle or self._idle_wanted  # least recently freed, unwanted first
        block, _ = lru.popitem(last=False)
        self.on_evict(block)
        return block

    def take(self, block: int, tenant: str) -> None:
        """One more hold on a cached block (a prefix hit), idle or held."""
        if self.ref_count[block] == 0:
            if block in self._idle:
                del self._idle[block]
            else:
                del self._idle_wanted[block]
            self._owner[block] = tenant
            self._held[tenant] = self._held.get(tenant, 0) + 1
        self.ref_count[block] += 1

    def release(
        self,
        blocks: list[int],
        tenant: str,
        block_hash: list[int | None],
        wanted: Mapping[int, int],
    ) -> None:
        """Drop one hold on each block; a block nobody holds any more becomes free, or
        idle when it keeps findable contents (`block_hash[block]` set: the prefix
        index's own list, read here because this runs for every block a request frees),
        in the LRU of wanted blocks when its hash is in `wanted`. The last block first,
        so that the LRU evicts a request's last blocks before its first."""
        ref_count, owner, held = self.ref_count, self._owner, self._held
        free, idle, idle_wanted = self._free, self._idle, self._idle_wanted
        mine = 0
        for block in reversed(blocks):
            refs = ref_count[block] - 1
            ref_count[block] = refs
            if refs:
                continue
            counted = owner[block]  # left as it is: read only while the block is held
            if counted == tenant:
                mine += 1
            else:  # a block shared across tenants, counted for another
                held[counted] -= 1  # type: ignore[index]
            key = block_hash[block]
            if key is None:
                free.append(block)
            elif key in wanted:
                idle_wanted[block] = None
            else:
                idle[block] = None
        if mine:
            held[tenant] -= mine

    # --- the idle blocks' order ---
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
            if block in held:
                assert self._owner[block] is not None, f"block {block} owner"
        free = set(self._free) | set(self._idle) | set(self._idle_wanted)
        assert len(free) == self.num_free, "block free twice"
        for block in self._idle_wanted:
            assert wanted(block), "an unwanted block kept"
        assert not free & set(held), "a held block is also free"
        assert len(free) + len(held) == self.num_blocks, "blocks leaked"
        counted: dict[str, int] = {}
        for block in held:
            tenant = self._owner[block]
            assert tenant is not None
            counted[tenant] = counted.get(tenant, 0) + 1
        assert counted == self.holdings(), "the tenants' holdings disagree with the tables"
