"""Locality-aware fair queueing: VTC's fairness, ordered by what the prefix cache holds.

Plain VTC interleaves clients request by request, so on a pool too small for every
client's prefix (system prompt, conversation, document) each client's prefix is
evicted before its next request is admitted, and prefilled again. Two policies keep
the fairness and let the cache work ("Locality-aware Fair Scheduling in LLM
Serving", Cao et al., 2025):

- `vtc-lpm`: VTC chooses the client (the smallest counter, the lift); among that
  client's requests, the one with the longest cached prefix goes first.
- `dlpm` (deficit longest prefix match): every backlogged client whose deficit is
  positive may go next, and among all of their requests the one with the longest
  cached prefix goes first; when no backlogged client has a positive deficit, every
  one is refilled by the quantum. A client that was idle goes first with its new
  request when the lift left it the least served (a tie VTC may break either way), as
  a sparse flow does in FQ-CoDel: holding a lone request back would not let it share
  anything, only make it wait. Written with VTC's counters: a client's deficit is
  `round_end - counter`, and a refill moves `round_end` to the smallest backlogged
  counter plus the quantum. So a client may run ahead of the smallest backlogged
  counter by at most the quantum while it keeps the cache warm, charges and the lift
  are VTC's, and ties between equal prefixes (no prefix cached at all, say) go to the
  smallest counter: without shared prefixes `dlpm` is VTC. The bound is VTC's plus
  the quantum (docs/fairness.md).

A request's cached prefix is followed by `CachedPrefixIndex` (core/cached_prefix_index.py);
within a client, priority (lower first) still comes before the prefix.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator, Mapping

from tokenfair.core.cached_prefix_index import CachedPrefixIndex, PrefixGroup
from tokenfair.core.policies.cached_heads import CachedHeadHeap
from tokenfair.core.policies.client_queues import ClientPick, WaitingQueue
from tokenfair.core.policies.declaration import Argument, Declared, Needs
from tokenfair.core.policies.ledger import CounterLedger
from tokenfair.core.policies.view import RequestView
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.prefix_cache import PrefixCache

# A quantum of a few prompts' worth lets a client run several requests over its warm
# prefix before the others catch up (docs/fairness.md: how it was chosen).
DEFAULT_QUANTUM = 4096.0

# (priority, band, -cached blocks, its first request's place in line, seq of the entry,
# group)
_QueueEntry = tuple[int, int, int, int, int, PrefixGroup]


class LongestPrefixQueue:
    """One client's waiting requests: priority (lower first), then a preempted request
    ahead of new ones, then the longest cached prefix, then arrival.

    The heap holds groups, not requests: the requests of one priority and band whose
    cached prefix is the same chain of blocks (core/cached_prefix_index.py), in line among
    themselves. A prefix evicted or cached again moves its group at once, however many
    requests wait on it."""

    __slots__ = ("_checked", "_heap", "_index", "_order", "_seq", "_size")

    def __init__(self, index: CachedPrefixIndex, seq: Iterator[int]) -> None:
        self._heap: list[_QueueEntry] = []
        self._index = index
        self._seq = seq
        self._size = 0
        # The top entry as last checked, and the cache's wanted evictions then: it
        # stands while it is still the top and nothing wanted was evicted since.
        self._checked: tuple[_QueueEntry, int] | None = None
        # The requests in heap order, until the next change: the holding share walks a
        # set-aside tenant's queue at every step.
        self._order: list[RequestView] | None = None

    def _file(self, group: PrefixGroup) -> None:
        """File a new entry of `group` (its key moved): the one that counts from now."""
        self._order = None
        entry = (
            group.priority,
            group.band,
            -group.blocks,
            group.members[0][0],
            next(self._seq),
            group,
        )
        group.filed = entry
        heap = self._heap
        heapq.heappush(heap, entry)
        if len(heap) > 2 * self._size + 64:
            heap[:] = [e for e in heap if e[5].filed is e]  # in place: `_top` holds it
            heapq.heapify(heap)

    def refile(self, group: PrefixGroup) -> None:
        """The group's cached prefix grew: file it where it now belongs."""
        if group.key is not None and group.owner is self:
            self._file(group)

    def _enter(self, request: RequestView, band: int) -> None:
        seq = next(self._seq)
        # Preempted requests go back last in, first out, as vLLM prepends them.
        order = -seq if band == 0 else seq
        group = self._index.track(request, self, band, order)
        self._size += 1
        self._order = None
        entry = group.filed
        if entry is None or entry[2] != -group.blocks or entry[3] != group.members[0][0]:
            self._file(group)

    def add(self, request: RequestView) -> None:
        self._enter(request, 1)

    def requeue(self, request: RequestView) -> None:
        self._enter(request, 0)

    def _top(self) -> _QueueEntry:
        """The entry of the head's group: live, in its place, its cached prefix checked."""
        heap, index = self._heap, self._index
        checked = self._checked
        if checked is not None and heap[0] is checked[0] and checked[1] == index.wanted_evictions:
            return checked[0]
        while True:
            entry = heap[0]
            group = entry[5]
            if group.filed is not entry:
                heapq.heappop(heap)  # retired entry
            elif entry[3] != group.members[0][0]:
                heapq.heappop(heap)  # its first request left: where it now belongs
                self._file(group)
            else:
                survivor = index.verify(group)
                if survivor is None:
                    self._checked = (entry, index.wanted_evictions)
                    return entry
                heapq.heappop(heap)  # evictions shortened its prefix: file it again
                self._file(survivor)

    def head(self) -> RequestView:
        return self._top()[5].members[0][1].request

    def head_blocks(self) -> int:
        """The head's cached leading blocks."""
        return -self._top()[2]

    def pop(self) -> RequestView:
        request = self.head()
        self._leave(request)
        return request

    def remove(self, request: RequestView) -> bool:
        group = self._index.group_of(request)
        if group is None or group.owner is not self:
            return False
        self._leave(request)
        return True

    def _leave(self, request: RequestView) -> None:
        self._index.untrack(request)  # its group's entry is filed again lazily
        self._size -= 1
        self._checked = None
        self._order = None

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[RequestView]:
        """In the order pops would take them with the cache as last checked."""
        if self._order is None:
            groups = sorted(
                (e for e in self._heap if e[5].filed is e),
                key=lambda e: (e[0], e[1], -e[5].blocks, e[5].members[0][0]),
            )
            order: list[RequestView] = []
            start = 0
            while start < len(groups):
                first = groups[start][5]
                end = start + 1
                while end < len(groups) and _same_rank(groups[end][5], first):
                    end += 1
                if end == start + 1:
                    order += first.requests()
                else:  # equally cached groups: their requests in line together
                    merged = sorted(m for e in groups[start:end] for m in e[5].members)
                    order += [member.request for _, member in merged]
                start = end
            self._order = order
        return iter(self._order)


def _same_rank(a: PrefixGroup, b: PrefixGroup) -> bool:
    return (a.priority, a.band, a.blocks) == (b.priority, b.band, b.blocks)


class LongestPrefixPick(ClientPick):
    """`vtc-lpm`: VTC's client; within it, the longest cached prefix first."""

    queues: Mapping[str, LongestPrefixQueue]  # made by new_queue

    def __init__(self) -> None:
        self.index = CachedPrefixIndex(self._prefix_grew)
        self._queue_seq = itertools.count()

    def new_queue(self) -> LongestPrefixQueue:
        return LongestPrefixQueue(self.index, self._queue_seq)

    def attach_prefix_cache(self, cache: PrefixCache) -> None:
        self.index.attach(cache)

    def _prefix_grew(self, group: PrefixGroup) -> None:
        queue = group.owner
        assert isinstance(queue, LongestPrefixQueue)
        queue.refile(group)
        self.prefix_grew(group.members[0][1].request.client, group.blocks)

    def prefix_grew(self, client: str, blocks: int) -> None:
        """Waiting requests of `client` now have `blocks` cached leading blocks (their
        queue has filed them again)."""


class DeficitPick(LongestPrefixPick):
    """`dlpm`: among clients with a positive deficit, the longest cached prefix first."""

    def __init__(self, quantum: float = DEFAULT_QUANTUM) -> None:
        if not quantum > 0:
            raise ValueError(f"quantum must be > 0, got {quantum}")
        super().__init__()
        self.quantum = quantum
        self._round_end = 0.0  # a backlogged client's deficit is round_end - counter
        # Clients back from idle, in arrival order: their first request goes first.
        self._returning: deque[str] = deque()

    def bind(self, queues: Mapping[str, WaitingQueue], ledger: CounterLedger) -> None:
        super().bind(queues, ledger)
        # Clients with a positive deficit, longest cached head first.
        self._eligible = CachedHeadHeap(self.queues, ledger)

    def _file_eligible(self, client: str) -> None:
        queue = self.queues.get(client)
        if queue is None or self.ledger.counter(client) >= self._round_end:
            self._eligible.retire(client)
            return
        self._eligible.file(client, queue.head_blocks())

    def _head_may_have_grown(self, client: str, blocks: int) -> None:
        """One of the client's requests now has `blocks` cached: re-file the client if
        that beats its entry (an understated entry would surface too late)."""
        filed = self._eligible.filed_blocks(client)
        if filed is not None and blocks > filed:
            self._file_eligible(client)

    def choose(self) -> str | None:
        while True:
            returning = self._first_returning()
            if returning is not None and self._is_least_served(returning):
                return returning
            best = self._longest_prefix_client()
            if returning is not None and best is not None:
                # Back from idle but ahead of someone, or out of deficit, while others
                # have some: it waits its turn like everyone else.
                self._returning.popleft()
                continue
            if best is not None:
                return best
            if not self.queues:
                return None
            self._refill()

    def _is_least_served(self, client: str) -> bool:
        """Within its deficit and at the smallest backlogged counter (where the lift put
        it), so serving it first is one of VTC's own choices, a tie broken its way."""
        ledger = self.ledger
        counter = ledger.counter(client)
        smallest = ledger.smallest()
        return counter < self._round_end and (
            smallest is None or counter <= ledger.counter(smallest)
        )

    def _first_returning(self) -> str | None:
        returning = self._returning
        while returning and returning[0] not in self.queues:
            returning.popleft()  # gone (aborted) before its turn
        return returning[0] if returning else None

    def _longest_prefix_client(self) -> str | None:
        """The client with a positive deficit whose head has the longest cached prefix
        (ties: the smallest counter), or None when no backlogged client has a deficit."""
        eligible = self._eligible
        while (top := eligible.top()) is not None:
            client, _, counter = top
            if counter < self._round_end:
                return client
            eligible.retire(client)  # its deficit is spent: it waits for a refill
        return None

    def _refill(self) -> None:
        """Nobody backlogged has a deficit left: give every backlogged client the quantum
        over the smallest backlogged counter."""
        smallest = self.ledger.smallest()
        assert smallest is not None
        self._round_end = self.ledger.counter(smallest) + self.quantum
        for client in self.queues:
            self._file_eligible(client)

    def entered(self, request: RequestView, joined: bool, arrival: bool) -> None:
        client = request.client
        if joined:
            if arrival:
                self._returning.append(client)
            self._file_eligible(client)
        else:
            self._head_may_have_grown(client, self.index.blocks(request))

    def left(self, request: RequestView, popped: bool) -> None:
        client = request.client
        if popped and self._returning and self._returning[0] == client:
            self._returning.popleft()  # its first request is in: it waits its turn now
        queue = self.queues.get(client)
        if queue is None:
            self._eligible.retire(client)  # nothing waits
        else:
            # The next head may come first by priority, with a longer prefix.
            self._head_may_have_grown(client, queue.head_blocks())

    def prefix_grew(self, client: str, blocks: int) -> None:
        self._head_may_have_grown(client, blocks)


DECLARED = [
    Declared(
        "vtc-lpm",
        "VTC between clients; within the chosen client, the request with the longest "
        "cached prefix first",
        lambda settings, arg: VTCPolicy(settings, name="vtc-lpm", pick=LongestPrefixPick()),
        needs=Needs(weights=True, prefix_cache=True),
    ),
    Declared(
        "dlpm",
        "deficit longest prefix match: among clients within `quantum` (default "
        f"{DEFAULT_QUANTUM:g}) weighted tokens of the least served, the longest cached "
        "prefix first",
        lambda settings, quantum: VTCPolicy(settings, name="dlpm", pick=DeficitPick(quantum)),
        argument=Argument("quantum", DEFAULT_QUANTUM),
        needs=Needs(weights=True, prefix_cache=True),
    ),
]
