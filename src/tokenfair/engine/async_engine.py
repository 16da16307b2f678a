"""The engine on a thread of the server process, fed by its asyncio event loop.

The engine thread owns the Engine: it alone touches the scheduler and the executor. The
loop hands it work through three queues drained before every step (new requests,
aborts, and calls such as metric snapshots or weight changes); after each step the
thread posts that step's outputs to the loop in one callback (EngineClient delivers
them). With nothing to do the thread sleeps on a condition variable and wakes on the
next submission.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from tokenfair.core.request import FinishReason, Request
from tokenfair.engine.engine import Engine, RequestOutput
from tokenfair.engine.engine_client import (
    EngineClient,
    delivery_order,
    fail_future,
    resolve_future,
)

log = logging.getLogger(__name__)

# Python hands the GIL between threads every 5 ms by default: long enough for a busy
# engine thread to add milliseconds to every HTTP response. A shorter slice keeps the
# event loop responsive while steps run back to back.
SWITCH_INTERVAL_S = 0.0005


class AsyncEngine(EngineClient):
    """Steps `engine` on a thread of this process; `submit` / `abort` / `call` from the loop."""

    def __init__(
        self,
        engine: Engine,
        on_step: Callable[[list[RequestOutput], float, int], None] | None = None,
    ) -> None:
        super().__init__(on_step)
        self.engine = engine
        self._cv = threading.Condition()
        self._inbox: list[Request] = []
        self._aborts: list[tuple[str, FinishReason]] = []
        self._calls: list[tuple[Callable[[Engine], Any], asyncio.Future[Any]]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

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

    def now(self) -> float:
        return self.engine.clock.now()

    @property
    def num_steps(self) -> int:
        return self.engine.num_steps  # read as it steps

    # --- from the event loop ---
    def _send_request(self, request: Request) -> None:
        with self._cv:
            self._inbox.append(request)
            self._cv.notify()

    def _send_abort(self, request_id: str, reason: FinishReason) -> None:
        with self._cv:
            self._aborts.append((request_id, reason))
            self._cv.notify()

    def _send_call(self, fn: Callable[[Engine], Any], future: asyncio.Future[Any]) -> None:
        with self._cv:
            self._calls.append((fn, future))
            self._cv.notify()

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
                    inbox, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                    calls, self._calls = self._calls, []
                    stopping = self._stopping
                verdicts = (
                    [] if stopping else [(r.request_id, engine.add_request(r)) for r in inbox]
                )
                for request_id, reason in aborts:
                    engine.abort(request_id, reason)
                if stopping:  # the aborts sent before the stop end their streams
                    self._hand_over(engine.aborted_outputs())
                    break
                if verdicts:
                    loop.call_soon_threadsafe(self._accepted, verdicts)
                for fn, future in calls:
                    try:
                        result = fn(engine)
                    except Exception as error:
                        loop.call_soon_threadsafe(fail_future, future, error)
                    else:
                        loop.call_soon_threadsafe(resolve_future, future, result)
                self._hand_over(engine.step())
        except BaseException as error:  # a bug in a step: fail every stream, loudly
            log.exception("the engine thread crashed")
            self.error = error
            with cv:
                self._stopping = True
            loop.call_soon_threadsafe(self._fail_all, "the engine thread crashed")

    def _hand_over(self, outputs: list[RequestOutput]) -> None:
        """Post a step's outputs to the loop, in one callback (none: nothing)."""
        if outputs:
            engine = self.engine
            ordered, urgent = delivery_order(outputs)
            assert self._loop is not None
            self._loop.call_soon_threadsafe(
                self._dispatch, ordered, urgent, engine.clock.now(), engine.num_steps
            )
