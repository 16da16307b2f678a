"""The swap area: a second, smaller pool of blocks in host memory.

A swapped-out request's blocks are copied here and its device blocks freed; swapping
in copies them back into fresh device blocks. Bounded by `num_blocks`.
"""

from __future__ import annotations


class SwapArea:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[str, list[int]] = {}  # request id -> its swap blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_hold(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def put(self, request_id: str, num_blocks: int) -> list[int]:
        """Swap blocks for a request's `num_blocks` device blocks (the caller checked
        `can_hold`)."""
        table = [self._free.pop() for _ in range(num_blocks)]
        self.tables[request_id] = table
        return table

    def drop(self, request_id: str) -> list[int] | None:
        """Free the request's swap blocks; return them (None if it has none)."""
        table = self.tables.pop(request_id, None)
        if table:
            self._free.extend(reversed(table))
        return table

    def check_invariants(self) -> None:
        swapped = [b for t in self.tables.values() for b in t]
        assert len(swapped) + len(self._free) == self.num_blocks, "swap blocks leaked"
