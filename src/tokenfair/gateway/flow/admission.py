"""The admission loop: requests wait here until an upstream serving their model has room.

One dispatcher task decides, one request at a time, whenever a request arrives or
capacity frees up, by asking the three seams of `gateway/flow/` in turn: the highest
band with a request that may go (`bands.py`), each of its tenants' first such request
(`order.py`), and which of those goes (`fairness.py`: VTC's counters, shared through
Redis, or the core's ordering policies). The chosen request goes where the pool's
router sends it (`UpstreamPool.choose`, upstreams/routing.py): which request runs next and where
it runs are decided apart.

A request that finds nothing waiting in this gateway and room upstream goes at once,
without a turn of the dispatcher (lifted and charged in this replica's counters). It is
the decision the dispatcher would take, minus its latency; whenever requests wait,
everything goes through the dispatcher. No decision waits for Redis: the counters are
merged in the background (replicas/redis_store.py).

A request retried after its upstream failed before the first byte goes ahead of every
waiting request and is not charged again.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from tokenfair.edge.errors import APIError, ErrorCode
from tokenfair.edge.tasks import cancel_and_wait
from tokenfair.gateway.flow.bands import BandedQueues
from tokenfair.gateway.flow.fairness import Fairness
from tokenfair.gateway.flow.order import TicketQueue
from tokenfair.gateway.flow.ticket import Ticket, TicketState
from tokenfair.gateway.upstreams.pool import Upstream, UpstreamPool

RECENT_DISPATCHES = 1000


class Admission:
    def __init__(self, pool: UpstreamPool, fairness: Callable[[int], Fairness]) -> None:
        self.pool = pool
        self.fairness = fairness  # band -> its fairness seam
        self._seq = itertools.count()
        self._queues = BandedQueues()
        self._retries: deque[Ticket] = deque()
        self.waiting: dict[str, int] = {}  # tenant -> waiting requests
        self.running: dict[str, int] = {}  # tenant -> dispatched requests
        self.num_waiting = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        # Dispatches so far, and the queueing of the last ones: how long each waited and
        # how many requests went ahead of it meanwhile (the order, free of clock noise).
        self.dispatches = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_DISPATCHES)
        # A request of this model starts waiting (capacity leases may grow for it).
        self.on_wait: Callable[[str], None] = lambda model: None
        pool.on_change = self.wake

    # --- lifecycle ---
    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        await cancel_and_wait([self._task])

    def wake(self) -> None:
        self._wake.set()

    # --- the request side ---
    async def wait(self, ticket: Ticket) -> Upstream:
        """Queue `ticket` and return the upstream it was dispatched to; APIError 429 when
        the policy refuses it at arrival (`rpm:N`)."""
        fairness = self.fairness(ticket.band)
        ticket.seq = next(self._seq)
        ticket.arrival = time.monotonic()
        ticket.key = fairness.order_key(ticket)
        ticket.dispatches_at_arrival = self.dispatches
        if not fairness.accept(ticket):
            raise APIError(
                429,
                f"tenant {ticket.tenant!r} is over the request rate of the gateway's policy",
                code=ErrorCode.RATE_LIMIT,
                headers={"Retry-After": "1"},
            )
        ticket.future = asyncio.get_running_loop().create_future()
        upstream = self._room_now(ticket)
        if upstream is not None:
            return await self._take_now(ticket, upstream, fairness)
        self._enqueue(ticket)
        self.on_wait(ticket.model)
        try:
            # The lift happens before the request is visible to the dispatcher.
            await fairness.arrive(ticket)
            if ticket.state is TicketState.WAITING:
                self._queues.add(ticket)
                self.wake()
            return await ticket.future
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise

    def _room_now(self, ticket: Ticket) -> Upstream | None:
        """An upstream for `ticket` when it may skip the queue: nothing waits here."""
        if self.num_waiting or self._retries:
            return None
        return self.pool.choose(ticket.model, ticket.tokens, ticket.seats, prefix=ticket.prefix)

    async def _take_now(self, ticket: Ticket, upstream: Upstream, fairness: Fairness) -> Upstream:
        """Dispatch at once: the slot is held, then the fairness step runs (in this
        process, to its end without suspending)."""
        self._dispatch(ticket, upstream)
        await fairness.take_now(ticket)
        return upstream

    def waiting_queues(self) -> Iterator[tuple[int, str, str, TicketQueue]]:
        """(band, tenant, model, queue) of every request waiting here in a queue."""
        return self._queues.waiting()

    @property
    def retrying(self) -> list[Ticket]:
        """Requests waiting for an upstream again, ahead of the queues."""
        return list(self._retries)

    def _enqueue(self, ticket: Ticket) -> None:
        ticket.move(TicketState.WAITING)
        self.waiting[ticket.tenant] = self.waiting.get(ticket.tenant, 0) + 1
        self.num_waiting += 1

    def _unwait(self, ticket: Ticket) -> None:
        left = self.waiting.get(ticket.tenant, 0) - 1
        if left > 0:
            self.waiting[ticket.tenant] = left
        else:
            self.waiting.pop(ticket.tenant, None)
        self.num_waiting -= 1

    def _abandon(self, ticket: Ticket) -> None:
        """The client went away (or timed out) before its request was dispatched."""
        if ticket.state is TicketState.WAITING:
            ticket.move(TicketState.RELEASED)
            self._unwait(ticket)
            self._queues.remove(ticket)
            self._spawn(self.fairness(ticket.band).leave(ticket))
        elif ticket.state is TicketState.PICKING:
            ticket.move(TicketState.ABANDONED)  # the dispatcher refunds it when the pick returns
        elif ticket.state is TicketState.DISPATCHED:
            self.release(ticket)
        elif ticket.state is TicketState.RETRYING:
            if ticket in self._retries:
                self._retries.remove(ticket)
            ticket.move(TicketState.RELEASED)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def release(self, ticket: Ticket) -> None:
        """The request is over: its upstream slot and tokens are free again."""
        if ticket.state is TicketState.DISPATCHED:
            assert ticket.upstream is not None
            ticket.upstream.release(ticket.tokens, ticket.seats)
            left = self.running.get(ticket.tenant, 0) - 1
            if left > 0:
                self.running[ticket.tenant] = left
            else:
                self.running.pop(ticket.tenant, None)
            ticket.move(TicketState.RELEASED)
            self.wake()

    async def retry(self, ticket: Ticket) -> Upstream | None:
        """After a failure before the first byte: another upstream, ahead of the queue."""
        failed = ticket.upstream
        self.release(ticket)
        assert failed is not None
        ticket.exclude = ticket.exclude | {failed.name}
        if not self.pool.any_eligible(ticket.model, ticket.exclude):
            return None
        ticket.upstream = None
        ticket.move(TicketState.RETRYING)
        ticket.future = asyncio.get_running_loop().create_future()
        self._retries.append(ticket)
        self.on_wait(ticket.model)
        self.wake()
        try:
            return await ticket.future
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise

    # --- the dispatcher ---
    def _dispatch(self, ticket: Ticket, upstream: Upstream) -> None:
        upstream.acquire(ticket.tokens, ticket.seats)
        if not ticket.recorded:
            ticket.recorded = True
            self.recent.append(
                {
                    "tenant": ticket.tenant,
                    "model": ticket.model,
                    "band": ticket.band,
                    "priority": ticket.priority,
                    "upstream": upstream.name,
                    "queue_s": round(time.monotonic() - ticket.arrival, 6),
                    "dispatched_ahead": self.dispatches - ticket.dispatches_at_arrival,
                }
            )
        self.dispatches += 1
        ticket.upstream = upstream
        ticket.move(TicketState.DISPATCHED)
        self.running[ticket.tenant] = self.running.get(ticket.tenant, 0) + 1
        assert ticket.future is not None
        if not ticket.future.done():
            ticket.future.set_result(upstream)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while await self._step():
                pass

    async def _step(self) -> bool:
        """Dispatch one request if any can go now; False when nothing can."""
        for ticket in list(self._retries):
            upstream = self.pool.choose(
                ticket.model, ticket.tokens, ticket.seats, ticket.exclude, ticket.prefix
            )
            if upstream is not None:
                self._retries.remove(ticket)
                self._dispatch(ticket, upstream)
                return True
        room: dict[tuple[str, int, int], bool] = {}

        def has_room(model: str, tokens: int, seats: int) -> bool:
            known = room.get((model, tokens, seats))
            if known is None:
                known = room[model, tokens, seats] = self.pool.has_room(model, tokens, seats)
            return known

        found = self._queues.candidates(has_room)
        if found is None:
            return False
        band, heads = found
        fairness = self.fairness(band)
        for ticket in heads:
            ticket.move(TicketState.PICKING)
        chosen = await fairness.pick(heads)
        for ticket in heads:
            if ticket is chosen:
                continue
            if ticket.state is TicketState.PICKING:
                ticket.move(TicketState.WAITING)
            elif ticket.state is TicketState.ABANDONED:  # left during the pick, never picked
                self._drop_abandoned(ticket)
                self._spawn(fairness.leave(ticket))
        if chosen.state is TicketState.ABANDONED:
            # Left while being picked: the pick already counted it out of waiting.
            await fairness.refund(chosen)
            self._drop_abandoned(chosen)
            return True
        self._queues.remove(chosen)
        self._unwait(chosen)
        upstream = self.pool.choose(chosen.model, chosen.tokens, chosen.seats, prefix=chosen.prefix)
        if upstream is None:  # capacity vanished during the pick (health, a lease)
            chosen.move(TicketState.RETRYING)
            self._retries.appendleft(chosen)
            self.on_wait(chosen.model)
            return True
        self._dispatch(chosen, upstream)
        return True

    def _drop_abandoned(self, ticket: Ticket) -> None:
        ticket.move(TicketState.RELEASED)
        self._queues.remove(ticket)
        self._unwait(ticket)
