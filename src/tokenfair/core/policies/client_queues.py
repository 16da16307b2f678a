"""The VTC queue's parts: each client's waiting requests, and the rule choosing the
client whose request goes next (`ClientPick`), VTC's own or one passed in (the
locality-aware policies: locality.py, miss_avoiding.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Protocol

from tokenfair.core.policies.ledger import CounterLedger
from tokenfair.core.policies.view import RequestView
from tokenfair.core.prefix_cache import PrefixCache

__all__ = ["ClientPick", "ClientQueue", "WaitingQueue"]


class WaitingQueue(Protocol):
    """One client's waiting requests, in the order that client's requests go."""

    def add(self, request: RequestView) -> None: ...
    def requeue(self, request: RequestView) -> None: ...
    def head(self) -> RequestView: ...
    def pop(self) -> RequestView: ...
    def remove(self, request: RequestView) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[RequestView]: ...


class ClientQueue:
    """One client's waiting requests in priority order (lower first), then arrival; a
    preempted request goes back ahead of its equals. Locality-aware VTC orders a
    client's requests otherwise (policies/locality.py)."""

    __slots__ = ("_requests",)

    def __init__(self) -> None:
        self._requests: deque[RequestView] = deque()

    def add(self, request: RequestView) -> None:
        queue = self._requests
        if queue and request.priority < queue[-1].priority:
            _insert_by_priority(queue, request, after_equals=True)
        else:
            queue.append(request)  # the usual case: arrival order

    def requeue(self, request: RequestView) -> None:
        queue = self._requests
        if queue and request.priority > queue[0].priority:
            _insert_by_priority(queue, request, after_equals=False)
        else:
            queue.appendleft(request)  # first among its equals: it was running

    def head(self) -> RequestView:
        return self._requests[0]

    def pop(self) -> RequestView:
        return self._requests.popleft()

    def remove(self, request: RequestView) -> bool:
        """Drop `request` if it waits here; whether it did."""
        if request not in self._requests:
            return False
        self._requests.remove(request)
        return True

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[RequestView]:
        return iter(self._requests)


class ClientPick:
    """The rule choosing the client whose request goes next, and how each client's
    requests wait: VTC's own here (the ledger's pick, a `ClientQueue` per client).

    The locality-aware rules (locality.py, miss_avoiding.py) order a client's requests
    by cached prefix and pick among clients otherwise. `VTCPolicy` owns the queues and
    tells its rule of every change to them (`entered`, `left`): a rule keeps whatever
    index it needs from those calls, and `choose` reads it as it is now, so nothing a
    rule decided can outlive the state it was decided on.
    """

    queues: Mapping[str, WaitingQueue]  # the clients with waiting requests, read live
    ledger: CounterLedger

    def bind(self, queues: Mapping[str, WaitingQueue], ledger: CounterLedger) -> None:
        self.queues = queues
        self.ledger = ledger

    def new_queue(self) -> WaitingQueue:
        """A queue for a client starting to wait."""
        return ClientQueue()

    def attach_prefix_cache(self, cache: PrefixCache) -> None:
        """The scheduler's prefix cache, for rules ordering by what it holds."""

    def choose(self) -> str | None:
        """The client whose head request goes next (None: nobody waits)."""
        return self.ledger.smallest()

    def entered(self, request: RequestView, joined: bool, arrival: bool) -> None:
        """`request` joined its client's queue (`joined`: the client was not waiting;
        `arrival`: a new request, else a preempted one back)."""

    def left(self, request: RequestView, popped: bool) -> None:
        """`request` left its client's queue (`popped`: admitted as the queue's choice,
        else removed: aborted, or admitted from behind a tenant set aside)."""


def _insert_by_priority(
    queue: deque[RequestView], request: RequestView, after_equals: bool
) -> None:
    """Insert into a queue kept in priority order: after the requests of the same
    priority (a new arrival), or before them (a preempted request going back)."""
    for index, other in enumerate(queue):
        if other.priority > request.priority or (
            not after_equals and other.priority == request.priority
        ):
            queue.insert(index, request)
            return
    queue.append(request)
