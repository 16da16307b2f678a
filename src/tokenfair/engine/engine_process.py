"""The engine in a process of its own, fed by the server's event loop over a socket.

On a thread of the server process the engine's Python (scheduling, sampling, the
executor's bookkeeping) and the event loop's Python (HTTP, SSE) take turns on one GIL,
and each waits for the other: the engine thread's every torch call gives the GIL up and
must win it back from the loop. In a process of its own, as vLLM's V1 engine core and
SGLang's scheduler run, the two proceed in parallel, and the server's HTTP work no
longer holds up a step.

    process = EngineProcess.launch(factory, kwargs)   # blocks until the engine is built
    process.card                                      # what `factory` said of itself
    process.start()                                   # on the loop; then submit/abort/call

The child is `python -m tokenfair.engine.engine_core FD` (engine_core.py). Requests,
aborts and calls go to it as messages (frames.py), everything queued in one turn of the
loop in one write; each step's outputs come back in one message, applied to the
server's own copy of each request before the streams see them, so the server's code is
the same for both engines. Calls must pickle; one that does not is refused at once.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tokenfair.core.request import FinishReason, Request
from tokenfair.engine.engine import Engine
from tokenfair.engine.engine_client import (
    EngineClient,
    EngineDeadError,
    fail_future,
    resolve_future,
)
from tokenfair.engine.frames import READ_SIZE, FrameBuffer, frame, read_one
from tokenfair.engine.wire import WireOutput, apply_wire_output, request_id_of

log = logging.getLogger(__name__)

# Asked for, capped by the system (net.core.wmem_max / rmem_max): the larger, the more
# of a step's outputs fit at once.
SOCKET_BUFFER_BYTES = 4 << 20


class EngineBuildError(ValueError):
    """The engine process could not build its engine; the message says why."""


class EngineProcess(EngineClient):
    """An engine stepping in a child process; `submit` / `abort` / `call` from the loop."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        sock: socket.socket,
        card: Any,
        clock_origin: float,
        frames: FrameBuffer,
    ) -> None:
        super().__init__()
        self.process = process
        self.card = card
        self._sock = sock
        self._clock_origin = clock_origin  # time.monotonic() at the engine clock's zero
        self._frames = frames  # the handshake's: whatever followed it is kept
        self._outbox: list[Any] = []
        self._unsent = bytearray()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._next_call = 0
        self._stopping = False
        self._closed = False

    @classmethod
    def launch(
        cls,
        factory: Callable[..., tuple[Any, Engine]],
        kwargs: dict[str, Any],
        log_level: str = "WARNING",
    ) -> EngineProcess:
        """Start the child, build the engine there and wait until it is ready. Call it
        from the main thread: on Linux the child dies with the thread that started it.

        EngineBuildError: the factory refused (its ValueError or OSError, one line) or
        the child died while building (its output says why)."""
        parent, child = socket.socketpair()
        for sock in (parent, child):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenfair.engine.engine_core", str(child.fileno())],
            pass_fds=[child.fileno()],
        )
        child.close()
        frames = FrameBuffer()
        try:
            parent.sendall(frame([("build", factory, kwargs, log_level)]))
            reply = read_one(parent, frames)
        except BaseException:
            process.kill()
            process.wait()
            parent.close()
            raise
        if reply is None or reply[0] != "ready":
            code = process.wait()
            parent.close()
            if reply is None:
                raise EngineBuildError(f"the engine process exited with code {code} while starting")
            raise EngineBuildError(reply[1])
        _, card, clock_origin = reply
        return cls(process, parent, card, clock_origin, frames)

    # --- lifecycle ---
    def start(self) -> None:
        """Take the socket onto the running loop; call from the loop that reads outputs."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._on_readable)

    async def stop(self) -> None:
        """Stop the engine (after the aborts already sent) and wait for its process."""
        if not (self._stopping or self._closed) and self._loop is not None:
            self._stopping = True
            self._queue(("stop",))
            self._flush()
        elif not self._closed:  # never started on a loop: closing the socket stops it
            self._stopping = True
            self._close_socket()
        try:
            await asyncio.to_thread(self.process.wait, 10.0)
        except subprocess.TimeoutExpired:
            log.warning("the engine process did not stop in 10 s; killing it")
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
        if not self._closed:  # what it sent before exiting (the aborts' last outputs)
            self._sock.setblocking(True)
            while not self._closed:
                self._on_readable()

    @property
    def alive(self) -> bool:
        return (
            self._loop is not None
            and not (self._stopping or self._closed)
            and self.process.poll() is None
        )

    def now(self) -> float:
        return time.monotonic() - self._clock_origin

    # --- to the engine ---
    def _send_request(self, request: Request) -> None:
        self._queue(("request", request))

    def _send_abort(self, request_id: str, reason: FinishReason) -> None:
        self._queue(("abort", request_id, reason))

    def _send_call(self, fn: Callable[[Engine], Any], future: asyncio.Future[Any]) -> None:
        try:
            pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # e.g. a lambda: refused here, the link stays usable
            fail_future(future, TypeError(f"a call to an engine process must pickle: {error}"))
            return
        call_id = self._next_call
        self._next_call += 1
        self._calls[call_id] = future
        self._queue(("call", call_id, fn))

    def _queue(self, message: tuple[Any, ...]) -> None:
        # Everything queued in one turn of the loop leaves in one write.
        if not self._outbox and self._loop is not None:
            self._loop.call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        if outbox and not self._closed:
            self._unsent += frame(outbox)
        self._write_some()

    def _write_some(self) -> None:
        if self._closed or not self._unsent:
            return
        try:
            sent = self._sock.send(self._unsent)
        except BlockingIOError:
            sent = 0
        except OSError:  # the child is gone: the reader side reports it
            self._unsent.clear()
            sent = 0
        del self._unsent[:sent]
        assert self._loop is not None
        if self._unsent:
            self._loop.add_writer(self._sock.fileno(), self._write_some)
        else:
            self._loop.remove_writer(self._sock.fileno())

    # --- from the engine ---
    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._on_lost()
            return
        try:
            messages = self._frames.feed(data)
        except Exception:
            log.exception("a message from the engine process could not be read")
            self.error = EngineDeadError("the engine process sent a message that cannot be read")
            self._on_lost()
            return
        for message in messages:
            try:
                self._on_message(message)
            except Exception:  # one bad handler must not lose the messages after it
                log.exception("handling the engine's %r message failed", message[0])

    def _on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "outputs":
            self._on_outputs(message[1], message[2], message[3], message[4])
        elif kind == "accepted":
            self._on_verdicts(message[1], message[2])
        elif kind == "result":
            _, call_id, ok, value = message
            future = self._calls.pop(call_id, None)
            if future is not None:
                (resolve_future if ok else fail_future)(future, value)
        elif kind == "crashed":
            log.error("the engine process crashed:\n%s", message[1])
            self.error = EngineDeadError("the engine process crashed")
            self._on_lost()  # it is exiting: nothing more will come

    def _on_verdicts(self, verdicts: list[tuple[str, bool, Any]], step: int) -> None:
        self._num_steps = step
        for request_id, ok, reason in verdicts:
            stream = self.streams.get(request_id)
            if stream is not None and not ok:
                stream.request.finish_reason = reason
        self._accepted([(request_id, ok) for request_id, ok, _ in verdicts])

    def _on_outputs(self, wired: list[WireOutput], urgent: int, now: float, step: int) -> None:
        streams = self.streams
        outputs = []
        dropped_urgent = 0
        for i, wire in enumerate(wired):
            stream = streams.get(request_id_of(wire))
            if stream is None:  # aborted here meanwhile, or unknown: nothing to tell
                if i < urgent:
                    dropped_urgent += 1
                continue
            outputs.append(apply_wire_output(wire, stream.request))
        self._dispatch(outputs, urgent - dropped_urgent, now, step)

    def _on_lost(self) -> None:
        expected = self._stopping and self.error is None
        self._close_socket()
        if not expected:
            if self.error is None:
                self.error = EngineDeadError("the engine process exited")
            log.error("the engine process exited unexpectedly (code %s)", self.process.poll())
        for future in self._calls.values():
            fail_future(future, EngineDeadError("the engine process exited"))
        self._calls.clear()
        self._fail_all("the engine process exited" if expected else "the engine process crashed")

    def _close_socket(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop.remove_writer(self._sock.fileno())
        self._sock.close()
