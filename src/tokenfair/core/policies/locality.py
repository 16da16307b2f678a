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

A request's cached prefix is followed by `CachedPrefixIndex` (core/prefix_cache.py);
within a client, priority (lower first) still comes before the prefix.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator, Mapping

from tokenfair.core.policies.cached_heads import CachedHeadHeap
from tokenfair.core.policies.client_queues import ClientPick, WaitingQueue
from tokenfair.core.policies.declaration import Argument, Declared, Needs
from tokenfair.core.policies.ledger import CounterLedger
from tokenfair.core.policies.view import RequestView
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.prefix_cache import CachedPrefixIndex, PrefixCache

# A quantum of a few prompts' worth lets a client run several requests over its warm
# prefix before the others catch up (docs/fairness.md: how it was chosen).
DEFAULT_QUANTUM = 4096.0

# (priority, band, -cached blocks, place in line, seq of the entry, request)
_QueueEntry = tuple[int, int, int, int, int, RequestView]


class LongestPrefixQueue:
    """One client's waiting requests: priority (lower first), then a preempted request
    ahead of new ones, then the longest cached prefix, then arrival."""

    __slots__ = ("_checked", "_heap", "_index", "_live", "_order", "_seq")

    def __init__(self, index: CachedPrefixIndex, seq: Iterator[int]) -> None:
        self._heap: list[_QueueEntry] = []
        # request id -> (seq of its one valid heap entry, band: 0 preempted, 1 new, its
        # place in line)
        self._live: dict[str, tuple[int, int, int]] = {}
        self._index = index
        self._seq = seq
        # The top entry as last checked, and the cache's wanted evictions then: it
        # stands while it is still the top and nothing wanted was evicted since.
        self._checked: tuple[_QueueEntry, int] | None = None
        # The live entries' requests in heap order, until the next filing or removal:
        # the holding share walks a set-aside tenant's queue at every step.
        self._order: list[RequestView] | None = None

    def _file(self, request: RequestView, band: int, order: int | None = None) -> None:
        """File a new entry of `request`. Filed again (its cached prefix changed), it
        keeps its place in line (`order`), so that which of two equally cached requests
        goes first never depends on when either was last looked at."""
        self._order = None
        seq = next(self._seq)
        if order is None:
            # Preempted requests go back last in, first out, as vLLM prepends them.
            order = -seq if band == 0 else seq
        self._live[request.request_id] = (seq, band, order)
        blocks = self._index.blocks(request)
        heap = self._heap
        heapq.heappush(heap, (request.priority, band, -blocks, order, seq, request))
        if len(heap) > 4 * len(self._live) + 64:
            heap[:] = [e for e in heap if self._is_live(e)]  # in place: `_top` holds it
            heapq.heapify(heap)

    def _is_live(self, entry: _QueueEntry) -> bool:
        live = self._live.get(entry[5].request_id)
        return live is not None and live[0] == entry[4]

    def add(self, request: RequestView) -> None:
        self._index.track(request)
        self._file(request, 1)

    def requeue(self, request: RequestView) -> None:
        self._index.track(request)
        self._file(request, 0)

    def refresh(self, request: RequestView) -> None:
        """The request's cached prefix changed: file it where it now belongs."""
        live = self._live.get(request.request_id)
        if live is not None:
            self._file(request, live[1], live[2])

    def _top(self) -> _QueueEntry:
        """The entry of the head: live, and its cached prefix checked."""
        heap, live, index = self._heap, self._live, self._index
        checked = self._checked
        if checked is not None and heap[0] is checked[0] and checked[1] == index.wanted_evictions:
            return checked[0]
        while True:
            entry = heap[0]
            request = entry[5]
            filed = live.get(request.request_id)
            if filed is None or filed[0] != entry[4]:
                heapq.heappop(heap)  # retired entry
            elif not index.verify(request):
                heapq.heappop(heap)  # evictions shortened its prefix: file it again
                self._file(request, filed[1], filed[2])
            else:
                self._checked = (entry, index.wanted_evictions)
                return entry

    def head(self) -> RequestView:
        return self._top()[5]

    def head_blocks(self) -> int:
        """The head's cached leading blocks."""
        return -self._top()[2]

    def pop(self) -> RequestView:
        request = self.head()
        heapq.heappop(self._heap)
        del self._live[request.request_id]
        self._order = None
        self._index.untrack(request)
        return request

    def remove(self, request: RequestView) -> bool:
        if self._live.pop(request.request_id, None) is None:
            return False
        self._checked = None  # it may have been the top
        self._order = None
        self._index.untrack(request)  # its heap entry is dropped lazily
        return True

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[RequestView]:
        """In the order pops would take them with the cache as it is."""
        if self._order is None:
            self._order = [e[5] for e in sorted(e for e in self._heap if self._is_live(e))]
        return iter(self._order)


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

    def _prefix_grew(self, request: RequestView) -> None:
        queue = self.queues.get(request.client)
        if queue is not None:
            queue.refresh(request)
            self.prefix_grew(request)

    def prefix_grew(self, request: RequestView) -> None:
        """A waiting request's cached prefix grew (its queue has filed it again)."""


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

    def prefix_grew(self, request: RequestView) -> None:
        self._head_may_have_grown(request.client, self.index.blocks(request))


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
