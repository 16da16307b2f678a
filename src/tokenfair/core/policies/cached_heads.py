"""Clients by how much of their next request's prompt is cached: the heap behind `dlpm`
and `vtc-hit`.

One entry per filed client: (-cached blocks of its head, counter, tie rank, seq,
client), so the top is the longest cached prefix, then the smallest counter, then the
ledger's tie rank (the first seen, where VTC is told to break ties that way), then the
entry filed first. Entries are not updated in place: an entry that overstates (the
client's counter grew, its head changed, an eviction shortened its prefix) is filed
again when it reaches the top, as VTC's heap does; one whose head's prefix grew must be
filed again by the policy (`file` when `blocks` beats `filed_blocks`), since an
understated entry would surface too late. Which clients are filed at all is the
policy's rule (`dlpm`: those with a deficit; `vtc-hit`: those with a cached prefix).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from typing import Protocol

from tokenfair.core.policies.ledger import CounterLedger

Entry = tuple[int, float, int, int, str]


class HeadQueue(Protocol):
    def head_blocks(self) -> int:
        """Cached leading blocks of the request that would go next."""
        ...


class CachedHeadHeap:
    """Filed clients, longest cached head first (ties: smallest counter, filed first)."""

    __slots__ = ("_filed", "_heap", "_ledger", "_queues", "_seq")

    def __init__(self, queues: Mapping[str, HeadQueue], ledger: CounterLedger) -> None:
        self._queues = queues  # the policy's own queues, read live
        self._ledger = ledger
        self._heap: list[Entry] = []
        self._filed: dict[str, tuple[int, int]] = {}  # client -> (seq, blocks) of its entry
        self._seq = itertools.count()

    def file(self, client: str, blocks: int) -> None:
        """(Re)file the client, its head having `blocks` cached leading blocks."""
        seq = next(self._seq)
        self._filed[client] = (seq, blocks)
        ledger = self._ledger
        heapq.heappush(
            self._heap, (-blocks, ledger.counter(client), ledger.tie_rank(client), seq, client)
        )
        heap = self._heap
        if len(heap) > 2 * len(self._filed) + 64:  # mostly retired entries: compact
            heap[:] = [e for e in heap if self._is_live(e)]  # in place: `top` holds it
            heapq.heapify(heap)

    def retire(self, client: str) -> None:
        self._filed.pop(client, None)  # its entries are dropped when they surface

    def filed_blocks(self, client: str) -> int | None:
        """The blocks its entry was filed with, or None when it is not filed."""
        filed = self._filed.get(client)
        return None if filed is None else filed[1]

    def _is_live(self, entry: Entry) -> bool:
        return self._filed.get(entry[4], (-1,))[0] == entry[3]

    def top(self) -> tuple[str, int, float] | None:
        """(client, cached blocks, counter) of the top entry, as they are now."""
        heap, queues, counter_of = self._heap, self._queues, self._ledger.counter
        while heap:
            entry = heap[0]
            negative_blocks, stored, _, _, client = entry
            if not self._is_live(entry):
                heapq.heappop(heap)  # retired entry
                continue
            blocks, counter = queues[client].head_blocks(), counter_of(client)
            if blocks != -negative_blocks or counter != stored:
                heapq.heappop(heap)  # its head or its counter moved: where it now belongs
                self.file(client, blocks)
                continue
            return client, blocks, counter
        return None

    def set_aside(self) -> Entry:
        """Take the top entry out (it stays filed) until `put_back`."""
        return heapq.heappop(self._heap)

    def put_back(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            heapq.heappush(self._heap, entry)
