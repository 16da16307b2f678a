"""The engine on its own thread, fed by an asyncio event loop (the server's).

The engine thread owns the Engine: it alone touches the scheduler and the executor.
The event loop hands it work through three queues drained before every step (new
requests, aborts, and calls such as metric snapshots or weight changes), so an abort is
honoured before the next step and nothing races with a step in progress.

After each step the thread posts that step's outputs to the loop in ONE callback; the
loop appends them to per-request streams that clients read at their own pace. A slow
client therefore never stalls a step: its tokens queue up in its stream. With nothing to
do the thread sleeps on a condition variable and wakes on the next submission.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tokenfair.core.request import FinishReason, Request
from tokenfair.engine.engine import Engine, RequestOutput

log = logging.getLogger(__name__)
T = TypeVar("T")

# Python hands the GIL between threads every 5 ms by default: long enough for a busy
# engine thread to add milliseconds to every HTTP response. A shorter slice keeps the
# event loop responsive while steps run back to back.
SWITCH_INTERVAL_S = 0.0005


DELIVERY_SLICE_S = 0.0002  # see AsyncEngine._deliver_slice


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shut down, or crashed: see the log)."""


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
        batch = list(self._pending)
        self._pending.clear()
        return batch

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while batch := await self.next_batch():
            for output in batch:
                yield output


class AsyncEngine:
    """Steps `engine` on a thread; `submit` / `abort` / `call` from the event loop."""

    def __init__(
        self,
        engine: Engine,
        on_step: Callable[[list[RequestOutput], float, int], None] | None = None,
    ) -> None:
        self.engine = engine
        # Called on the loop with a step's outputs, the engine time they were handed
        # over at and the engine's step count then (metrics), right after the streams
        # got them, in the same callback: a client that has read its last token and
        # then scrapes the metrics finds it counted.
        self.on_step = on_step
        self.streams: dict[str, RequestStream] = {}
        self._cv = threading.Condition()
        self._inbox: list[Request] = []
        self._aborts: list[tuple[str, FinishReason]] = []
        self._calls: list[tuple[Callable[[Engine], Any], asyncio.Future[Any]]] = []
        # Steps whose outputs are not all delivered yet (see _deliver_slice).
        self._backlog: collections.deque[_Delivery] = collections.deque()
        self._delivering = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None

    # --- lifecycle ---
    def start(self) -> None:
        """Start the engine thread; call from the event loop that will read the outputs."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._run, name="tokenfair-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    # --- from the event loop ---
    def submit(self, request: Request) -> RequestStream:
        """Queue a request for the next step; its outputs arrive on the returned stream."""
        if not self.alive:
            raise EngineDeadError("the engine is not running")
        assert self._loop is not None
        stream = RequestStream(request, self._loop)
        self.streams[request.request_id] = stream
        with self._cv:
            self._inbox.append(request)
            self._cv.notify()
        return stream

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        """Cancel a request; honoured before the next step. Unknown or finished ids: no-op."""
        if request_id not in self.streams:
            return
        with self._cv:
            self._aborts.append((request_id, reason))
            self._cv.notify()

    async def call(self, fn: Callable[[Engine], T]) -> T:
        """Run `fn(engine)` on the engine thread between two steps; return its result."""
        if not self.alive:
            raise EngineDeadError("the engine is not running")
        assert self._loop is not None
        future: asyncio.Future[T] = self._loop.create_future()
        with self._cv:
            self._calls.append((fn, future))
            self._cv.notify()
        return await future

    # --- on the engine thread ---
    def _run(self) -> None:
        engine, cv, loop = self.engine, self._cv, self._loop
        assert loop is not None
        try:
            while True:
                with cv:
                    while not (
                        self._inbox
                        or self._aborts
                        or self._calls
                        or self._stopping
                        or engine.has_unfinished()
                    ):
                        cv.wait()
                    if self._stopping:
                        break
                    inbox, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                    calls, self._calls = self._calls, []
                verdicts = [(r, engine.add_request(r)) for r in inbox]
                for request_id, reason in aborts:
                    self._abort(request_id, reason)
                if verdicts:
                    loop.call_soon_threadsafe(self._accepted, verdicts)
                for fn, future in calls:
                    try:
                        result = fn(engine)
                    except Exception as error:
                        loop.call_soon_threadsafe(_fail, future, error)
                    else:
                        loop.call_soon_threadsafe(_resolve, future, result)
                outputs = engine.step()
                if outputs:
                    loop.call_soon_threadsafe(
                        self._dispatch, outputs, engine.clock.now(), engine.num_steps
                    )
        except BaseException as error:  # a bug in a step: fail every stream, loudly
            log.exception("the engine thread crashed")
            self.error = error
            with cv:
                self._stopping = True
            loop.call_soon_threadsafe(self._fail_all)

    def _abort(self, request_id: str, reason: FinishReason) -> None:
        engine = self.engine
        if request_id not in engine.scheduler.requests:
            return
        if reason is FinishReason.ABORT:
            engine.abort(request_id)
        else:  # e.g. a timeout reported as its own reason: same path, other label
            request = engine.scheduler.requests[request_id]
            engine.abort(request_id)
            request.finish_reason = reason

    # --- back on the loop ---
    def _accepted(self, verdicts: list[tuple[Request, bool]]) -> None:
        for request, ok in verdicts:
            stream = self.streams.get(request.request_id)
            if stream is None:
                continue
            if not stream.accepted.done():
                stream.accepted.set_result(ok)
            if not ok:
                self._close(stream)

    def _dispatch(self, outputs: list[RequestOutput], now: float, step: int) -> None:
        # First tokens and ends go first: TTFT and end-to-end latency wait for them,
        # while a token in the middle of a stream can wait a little longer.
        first: list[RequestOutput] = []
        later: list[RequestOutput] = []
        for output in outputs:
            (first if output.finished or _is_first(output) else later).append(output)
        self._backlog.append(_Delivery(first + later, now, step))
        if not self._delivering:
            self._delivering = True
            self._deliver_slice()

    def _deliver_slice(self) -> None:
        """Deliver outputs, oldest first, for DELIVERY_SLICE_S; the rest after the loop's
        next turn.

        With the loop free to read sockets between two slices, a client whose stream
        just ended sends its next request at once, and that request does not wait until
        every token of the step is written. A slice is a time budget, not a count.
        While the loop is behind (a later step's outputs already wait), outputs go out
        without a budget and to the readers rather than the sinks: each reader then
        takes all its stream's tokens at once (one write for several tokens), which is
        what a saturated server needs. Outputs go strictly in order, so a stream's
        tokens never overtake each other, even when the next step's outputs arrive
        meanwhile.
        """
        backlog, streams = self._backlog, self.streams
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
                out_of_time = offer and time.perf_counter() > deadline
            delivery.at = end
            if self.on_step is not None:
                self.on_step(outputs[at:end], delivery.now, delivery.step)
            if end == len(outputs):
                backlog.popleft()
        if backlog:
            assert self._loop is not None
            self._loop.call_soon(self._deliver_slice)
        else:
            self._delivering = False

    def _close(self, stream: RequestStream) -> None:
        stream.done = True
        stream.finish_reason = stream.request.finish_reason
        stream._event.set()
        self.streams.pop(stream.request_id, None)

    def _fail_all(self) -> None:
        for stream in list(self.streams.values()):
            if not stream.accepted.done():
                stream.accepted.set_exception(EngineDeadError("the engine thread crashed"))
            self._close(stream)


@dataclass(slots=True)
class _Delivery:
    """One step's outputs, in delivery order, and how many went out."""

    outputs: list[RequestOutput]
    now: float
    step: int
    at: int = 0


def _is_first(output: RequestOutput) -> bool:
    """The request's first tokens: every token it has is in this output."""
    return len(output.request.output_token_ids) == len(output.new_token_ids)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
