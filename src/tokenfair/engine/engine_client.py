"""What the event loop (the server's) sees of an engine that steps beside it.

`EngineClient`: `submit`, `abort` and `call` hand the engine work, which it takes in
before its next step (so an abort is honoured before the next step and nothing races a
step in progress), and each step's outputs come back in ONE hand-over, which the client
appends to per-request streams (`RequestStream`) that readers take at their own pace. A
slow reader therefore never stalls a step: its tokens queue up in its stream (the
server bounds what waits for each of its clients: server/backlog.py).

Two engines implement it: `AsyncEngine` (async_engine.py) steps the Engine on a thread
of this process, and `EngineProcess` (engine_process.py) in a process of its own, where
its Python does not share the event loop's GIL.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tokenfair.core.request import FinishReason, Request
from tokenfair.engine.engine import Engine, RequestOutput

T = TypeVar("T")

DELIVERY_SLICE_S = 0.0002  # see EngineClient._deliver_slice
# The longest that lower-priority loop work (a step's middle tokens, waking accepted
# requests) waits for new requests to be taken in (see EngineClient.urgent_work).
MAX_YIELD_S = 0.005


class EngineDeadError(RuntimeError):
    """The engine stopped (shut down, or crashed: see the log)."""


class RequestStream:
    """One request's outputs as they arrive; iterate with `async for` or `await next_batch()`.

    `accepted` resolves once the engine thread has queued (True) or refused (False,
    the request finished REJECTED) the request.

    `sink`, when set, is offered each output first, on the loop, as it arrives: it
    returns True when it consumed it (no wake-up of the reader, which is what makes a
    token cheap), False to leave it, and everything after it, to `next_batch`. The
    engine skips the offer while its deliveries run behind (see `_deliver_slice`).
    """

    __slots__ = ("_event", "_pending", "accepted", "done", "finish_reason", "request", "sink")

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.accepted: asyncio.Future[bool] = loop.create_future()
        self._pending: collections.deque[RequestOutput] = collections.deque()
        self._event = asyncio.Event()
        self.done = False
        self.finish_reason: FinishReason | None = None
        self.sink: Callable[[RequestOutput], bool] | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def _put(self, output: RequestOutput, offer: bool = True) -> None:
        if self.done:  # cut (EngineClient.cut): its reader has stopped
            return
        sink = self.sink
        if offer and sink is not None and not self._pending and sink(output):
            return
        self._pending.append(output)
        self._event.set()

    async def next_batch(self) -> list[RequestOutput]:
        """Every output that arrived since the last call (waits for at least one);
        empty once the request has finished and everything was read."""
        while not self._pending:
            if self.done:
                return []
            self._event.clear()
            await self._event.wait()
        return self.take()

    async def wait(self) -> None:
        """Until an output waits to be taken, the stream is done, or `wake()` is called:
        for a reader that has something else to wait for too (its client's socket)."""
        if self._pending or self.done:
            return
        self._event.clear()
        await self._event.wait()

    def wake(self) -> None:
        """End the reader's `wait()` now."""
        self._event.set()

    @property
    def wakeup(self) -> asyncio.Event:
        """Set when an output waits, the stream is done, or `wake()` is called."""
        return self._event

    def share_wakeup(self, event: asyncio.Event) -> None:
        """Set `event`, from now on, where this stream would set its own `wakeup`: one
        reader of several streams (an answer's choices) waits on one event."""
        self._event = event
        if self._pending or self.done:
            event.set()

    def take(self) -> list[RequestOutput]:
        """Every output waiting now (none: empty), without waiting."""
        batch = list(self._pending)
        self._pending.clear()
        return batch

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while batch := await self.next_batch():
            for output in batch:
                yield output


class EngineClient(abc.ABC):
    """The loop side of an engine stepping elsewhere: streams, and their delivery.

    Subclasses carry the work to the engine (`_send_request`, `_send_abort`,
    `_send_call`) and bring back, on the loop: acceptance verdicts (`_accepted`), a
    step's outputs (`_dispatch`), call results, and failure (`_fail_all`).
    """

    def __init__(
        self, on_step: Callable[[list[RequestOutput], float, int], None] | None = None
    ) -> None:
        # Called on the loop with a step's outputs, the engine time they were handed
        # over at and the engine's step count then (metrics), right after the streams
        # got them, in the same callback: a client that has read its last token and
        # then scrapes the metrics finds it counted.
        self.on_step = on_step
        self.streams: dict[str, RequestStream] = {}
        # Steps whose outputs are not all delivered yet (see _deliver_slice).
        self._backlog: collections.deque[_Delivery] = collections.deque()
        self._delivering = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._num_steps = 0
        # True while the loop has more urgent work queued: requests that arrived and
        # whose handlers have not run yet (the server's Intake). Middle tokens and the
        # wake-up of accepted requests wait for it, for at most MAX_YIELD_S.
        self.urgent_work: Callable[[], bool] | None = None

    @property
    def num_steps(self) -> int:
        """The engine's step count, as of its latest hand-over."""
        return self._num_steps

    # --- what an engine provides ---
    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    @abc.abstractmethod
    def now(self) -> float:
        """The engine's clock (request arrival times are on it)."""
        ...

    @abc.abstractmethod
    def _send_request(self, request: Request) -> None: ...

    @abc.abstractmethod
    def _send_abort(self, request_id: str, reason: FinishReason) -> None: ...

    @abc.abstractmethod
    def _send_call(self, fn: Callable[[Engine], Any], future: asyncio.Future[Any]) -> None: ...

    # --- from the event loop ---
    def submit(self, request: Request) -> RequestStream:
        """Queue a request for the next step; its outputs arrive on the returned stream."""
        if not self.alive:
            raise EngineDeadError("the engine is not running")
        assert self._loop is not None
        stream = RequestStream(request, self._loop)
        self.streams[request.request_id] = stream
        self._send_request(request)
        return stream

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        """Cancel a request; honoured before the next step. Unknown or finished ids: no-op."""
        if request_id not in self.streams:
            return
        self._send_abort(request_id, reason)

    def cut(self, request_id: str) -> None:
        """Abort a request and end its stream now, with the outputs already delivered,
        rather than at the engine's last output of it (which waits for the step in
        progress, and for a slow reader's backlog before it). That output still comes,
        for the metrics; what arrives meanwhile is never read. Unknown or finished ids:
        no-op."""
        stream = self.streams.get(request_id)
        if stream is None or stream.done:
            return
        self._send_abort(request_id, FinishReason.ABORT)
        stream.done = True
        stream._event.set()

    async def call(self, fn: Callable[[Engine], T]) -> T:
        """Run `fn(engine)` where the engine steps, between two steps; return its result.
        (An engine in its own process needs `fn` and its result to pickle.)"""
        if not self.alive:
            raise EngineDeadError("the engine is not running")
        assert self._loop is not None
        future: asyncio.Future[T] = self._loop.create_future()
        self._send_call(fn, future)
        return await future

    # --- back on the loop ---
    def _accepted(self, verdicts: list[tuple[str, bool]]) -> None:
        """Apply the engine's verdicts now; wake the waiting requests a little later.

        A verdict arrives with the outputs of the step just ended, whose ends and first
        tokens go out first and whose clients then send new requests. Accepted requests
        have a whole step before their first token, so they carry on (open their
        responses) after the loop has taken in what arrived meanwhile (`urgent_work`).
        A stream may even end before its reader wakes (a loop that fell far behind
        reads many steps at once): the verdict is bound to the stream here, so it
        still comes.
        """
        woken: list[tuple[RequestStream, bool]] = []
        for request_id, ok in verdicts:
            stream = self.streams.get(request_id)
            if stream is None:
                continue
            woken.append((stream, ok))
            if not ok:
                self._close(stream)
        if woken:
            assert self._loop is not None
            self._loop.call_soon(self._wake_accepted, woken, time.perf_counter())

    def _wake_accepted(self, woken: list[tuple[RequestStream, bool]], since: float) -> None:
        if self._yielding(since):
            assert self._loop is not None
            self._loop.call_soon(self._wake_accepted, woken, since)
            return
        for stream, ok in woken:
            resolve_future(stream.accepted, ok)

    def _yielding(self, since: float) -> bool:
        """Whether lower-priority work queued at `since` should let new requests in first."""
        urgent_work = self.urgent_work
        return (
            urgent_work is not None and urgent_work() and time.perf_counter() - since < MAX_YIELD_S
        )

    def _dispatch(self, outputs: list[RequestOutput], urgent: int, now: float, step: int) -> None:
        """A step's outputs, in `delivery_order` (its first `urgent` outputs urgent)."""
        self._num_steps = step
        self._backlog.append(_Delivery(outputs, urgent, now, step, time.perf_counter()))
        if not self._delivering:
            self._delivering = True
            self._deliver_slice()

    def _deliver_slice(self) -> None:
        """Deliver outputs, oldest first: a step's urgent ones (ends, first tokens) at
        once, the rest for DELIVERY_SLICE_S; what is left on a later turn of the loop.

        With the loop free to read sockets between two slices, a client whose stream
        just ended sends its next request at once, and that request does not wait until
        every token of the step is written: while requests wait to be taken in
        (`urgent_work`), the next slice waits for them. A slice is a time budget, not a
        count. While the loop is behind (a later step's outputs already wait), outputs go
        out without a budget and to the readers rather than the sinks: each reader then
        takes all its stream's tokens at once (one write for several tokens), which is
        what a saturated server needs. Outputs go strictly in order, so a stream's
        tokens never overtake each other, even when the next step's outputs arrive
        meanwhile.
        """
        backlog, streams = self._backlog, self.streams
        assert self._loop is not None
        if not backlog:
            self._delivering = False
            return
        first = backlog[0]
        if len(backlog) == 1 and first.at >= first.urgent and self._yielding(first.handed_at):
            self._loop.call_soon(self._deliver_slice)
            return
        deadline = time.perf_counter() + DELIVERY_SLICE_S
        out_of_time = False
        while backlog and not out_of_time:
            offer = len(backlog) == 1  # else the loop is behind: see above
            delivery = backlog[0]
            outputs, at = delivery.outputs, delivery.at
            end = at
            while end < len(outputs) and not out_of_time:
                output = outputs[end]
                end += 1
                stream = streams.get(output.request_id)
                if stream is not None:
                    stream._put(output, offer)
                    if output.finished:
                        self._close(stream)
                out_of_time = (
                    offer
                    and end >= delivery.urgent
                    and (time.perf_counter() > deadline or self._yielding(delivery.handed_at))
                )
            delivery.at = end
            if self.on_step is not None:
                self.on_step(outputs[at:end], delivery.now, delivery.step)
            if end == len(outputs):
                backlog.popleft()
        if backlog:
            self._loop.call_soon(self._deliver_slice)
        else:
            self._delivering = False

    def _close(self, stream: RequestStream) -> None:
        stream.done = True
        stream.finish_reason = stream.request.finish_reason
        stream._event.set()
        self.streams.pop(stream.request_id, None)

    def _fail_all(self, why: str = "the engine crashed") -> None:
        for stream in list(self.streams.values()):
            if not stream.accepted.done():
                stream.accepted.set_exception(EngineDeadError(why))
            self._close(stream)


@dataclass(slots=True)
class _Delivery:
    """One step's outputs, in delivery order, and how many went out."""

    outputs: list[RequestOutput]
    urgent: int  # the first `urgent` outputs go out without a time budget
    now: float
    step: int
    handed_at: float  # perf_counter() when the loop got it
    at: int = 0


def delivery_order(outputs: list[RequestOutput]) -> tuple[list[RequestOutput], int]:
    """A step's outputs in the order the loop delivers them, and how many are urgent.

    Ends go first (end-to-end latency waits for them, and each frees a client to send
    its next request), then first tokens (TTFT waits for them); a token in the middle
    of a stream can wait a little longer. Run where the engine steps, before the
    hand-over, so the event loop does not pay for it.
    """
    ends: list[RequestOutput] = []
    firsts: list[RequestOutput] = []
    middles: list[RequestOutput] = []
    for output in outputs:
        if output.finished:
            ends.append(output)
        elif len(output.request.output_token_ids) == len(output.new_token_ids):
            firsts.append(output)  # every token the request has is in this output
        else:
            middles.append(output)
    ordered = ends + firsts
    urgent = len(ordered)
    ordered += middles
    return ordered, urgent


def resolve_future(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def fail_future(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
