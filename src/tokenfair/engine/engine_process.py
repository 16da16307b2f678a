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

The child is `python -m tokenfair.engine.engine_process FD`, the socket its only link:
`factory(**kwargs)` (pickled by reference) builds `(card, engine)` there; the card comes
back in the ready message. Then the child runs the same loop as the engine thread
(`AsyncEngine`): take in requests, aborts and calls; step; send the step's outputs in
one message. Each output carries what the server reads of its request (new tokens and
text, finish reason and times, preemptions), and the loop side applies it to its own
copy of the request before the streams see it, so the server's code is the same for
both engines.

Messages are pickled lists framed by a 4-byte length. The child ignores SIGINT, SIGHUP
and SIGTERM (a terminal's Ctrl-C or hangup and a service manager's stop reach the whole
process group; the server decides when its engine stops, after aborting what is in
flight) and exits when the socket closes, so it never outlives the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from tokenfair.core.request import FinishReason, Request
from tokenfair.engine.async_engine import (
    EngineClient,
    EngineDeadError,
    _fail,
    _resolve,
    abort_in_engine,
)
from tokenfair.engine.engine import Engine, RequestOutput

log = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
SOCKET_BUFFER_BYTES = 4 << 20  # a step's outputs for thousands of streams fit at once


class EngineBuildError(ValueError):
    """The engine process could not build its engine; the message says why."""


def frame(messages: list[Any]) -> bytes:
    payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


class FrameBuffer:
    """Bytes in, whole messages out."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> Iterator[Any]:
        buffer = self._data
        buffer += data
        while len(buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer)
            end = HEADER.size + size
            if len(buffer) < end:
                return
            messages = pickle.loads(memoryview(buffer)[HEADER.size : end])
            del buffer[:end]
            yield from messages


def _wire(output: RequestOutput) -> tuple[Any, ...]:
    request = output.request
    return (
        request.request_id,
        output.new_token_ids,
        output.new_text,
        output.finished,
        output.logprobs,
        request.finish_reason,
        request.first_token_s,
        request.finish_s,
        request.preemptions,
    )


# --- the loop side -------------------------------------------------------------------


class EngineProcess(EngineClient):
    """An engine stepping in a child process; `submit` / `abort` / `call` from the loop."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket, card: Any,
                 clock_origin: float, on_step: Callable[[list[RequestOutput], float, int], None]
                 | None = None) -> None:  # fmt: skip
        super().__init__(on_step)
        self.process = process
        self.card = card
        self._sock = sock
        self._clock_origin = clock_origin  # time.monotonic() at the engine clock's zero
        self._frames = FrameBuffer()
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
        """Start the child, build the engine there and wait until it is ready.

        EngineBuildError: the factory refused (its ValueError or OSError, one line) or
        the child died while building (its output says why)."""
        parent, child = socket.socketpair()
        for sock in (parent, child):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenfair.engine.engine_process", str(child.fileno())],
            pass_fds=[child.fileno()],
        )
        child.close()
        try:
            parent.sendall(frame([("build", factory, kwargs, log_level)]))
            reply = _read_one(parent, FrameBuffer())
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
        return cls(process, parent, card, clock_origin)

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
        self._close_socket()

    @property
    def alive(self) -> bool:
        return not (self._stopping or self._closed) and self.process.poll() is None

    def now(self) -> float:
        return time.monotonic() - self._clock_origin

    # --- to the engine ---
    def _send_request(self, request: Request) -> None:
        self._queue(("request", request))

    def _send_abort(self, request_id: str, reason: FinishReason) -> None:
        self._queue(("abort", request_id, reason))

    def _send_call(self, fn: Callable[[Engine], Any], future: asyncio.Future[Any]) -> None:
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
        if self._outbox and not self._closed:
            self._unsent += frame(self._outbox)
        self._outbox = []
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
            return
        del self._unsent[:sent]
        assert self._loop is not None
        if self._unsent:
            self._loop.add_writer(self._sock.fileno(), self._write_some)
        else:
            self._loop.remove_writer(self._sock.fileno())

    # --- from the engine ---
    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._on_lost()
            return
        for message in self._frames.feed(data):
            kind = message[0]
            if kind == "outputs":
                self._on_outputs(message[1], message[2], message[3])
            elif kind == "accepted":
                self._accepted(message[1])
            elif kind == "result":
                _, call_id, ok, value = message
                future = self._calls.pop(call_id, None)
                if future is not None:
                    (_resolve if ok else _fail)(future, value)
            elif kind == "crashed":
                log.error("the engine process crashed:\n%s", message[1])
                self.error = EngineDeadError("the engine process crashed")

    def _on_outputs(self, wired: list[tuple[Any, ...]], now: float, step: int) -> None:
        streams = self.streams
        outputs = []
        for rid, new_ids, new_text, finished, logprobs, reason, first_s, finish_s, pre in wired:
            stream = streams.get(rid)
            if stream is None:  # aborted here meanwhile, or unknown: nothing to tell
                continue
            request = stream.request
            request.output_token_ids.extend(new_ids)
            request.first_token_s = first_s
            request.preemptions = pre
            if finished:
                request.finish_reason = reason
                request.finish_s = finish_s
            outputs.append(RequestOutput(request, new_ids, new_text, finished, logprobs))
        self._dispatch(outputs, now, step)

    def _on_lost(self) -> None:
        expected = self._stopping
        self._close_socket()
        if not expected:
            if self.error is None:
                self.error = EngineDeadError("the engine process exited")
            log.error("the engine process exited unexpectedly (code %s)", self.process.poll())
        for future in self._calls.values():
            _fail(future, EngineDeadError("the engine process exited"))
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


def _read_one(sock: socket.socket, frames: FrameBuffer) -> Any:
    """The first message of a frame holding one, blocking; None at end of file."""
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return None
        for message in frames.feed(data):
            return message


# --- the engine side -----------------------------------------------------------------


class EngineCore:
    """The child's loop: messages in, steps, outputs out."""

    def __init__(self, sock: socket.socket, engine: Engine, frames: FrameBuffer) -> None:
        self.sock = sock
        self.engine = engine
        self.frames = frames
        self.stopping = False

    def receive(self, wait: bool) -> list[Any] | None:
        """Every message waiting (blocking for one when `wait`); None at end of file."""
        messages: list[Any] = []
        sock = self.sock
        while True:
            ready, _, _ = select.select([sock], [], [], None if wait and not messages else 0)
            if not ready:
                return messages
            data = sock.recv(1 << 20)
            if not data:
                return None
            messages.extend(self.frames.feed(data))

    def send(self, messages: list[Any]) -> None:
        self.sock.sendall(frame(messages))

    def run(self) -> None:
        engine = self.engine
        while not self.stopping:
            messages = self.receive(wait=not engine.has_unfinished())
            if messages is None:
                return  # the server is gone
            replies = self.handle(messages)
            if replies:  # before the step: a verdict should not wait for it
                self.send(replies)
            if self.stopping:
                return
            outputs = engine.step()
            if outputs:
                wired = [_wire(o) for o in outputs]
                self.send([("outputs", wired, engine.clock.now(), engine.num_steps)])

    def handle(self, messages: list[Any]) -> list[Any]:
        engine = self.engine
        verdicts: list[tuple[str, bool]] = []
        replies: list[Any] = []
        for message in messages:
            kind = message[0]
            if kind == "request":
                request = message[1]
                verdicts.append((request.request_id, engine.add_request(request)))
            elif kind == "abort":
                abort_in_engine(engine, message[1], message[2])
            elif kind == "call":
                replies.append(self.call(message[1], message[2]))
            elif kind == "stop":
                self.stopping = True
        if verdicts:
            replies.insert(0, ("accepted", verdicts))
        return replies

    def call(self, call_id: int, fn: Callable[[Engine], Any]) -> tuple[Any, ...]:
        try:
            result = fn(self.engine)
            pickle.dumps(result)
        except Exception as error:
            try:
                pickle.dumps(error)
            except Exception:
                error = RuntimeError(f"{type(error).__name__}: {error}")
            return ("result", call_id, False, error)
        return ("result", call_id, True, result)


def main(fd: int) -> int:
    # Ctrl-C, a hangup and a service manager's SIGTERM reach the whole process group;
    # the server decides when its engine stops (it aborts what is in flight first).
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    frames = FrameBuffer()
    build = _read_one(sock, frames)
    if build is None:
        return 0
    _, factory, kwargs, log_level = build
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        card, engine = factory(**kwargs)
    except (ValueError, OSError) as error:
        sock.sendall(frame([("failed", str(error))]))
        return 2
    except Exception:
        sock.sendall(frame([("failed", traceback.format_exc())]))
        return 1
    clock_origin = time.monotonic() - engine.clock.now()
    sock.sendall(frame([("ready", card, clock_origin)]))
    core = EngineCore(sock, engine, frames)
    try:
        core.run()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the server went away mid-send
    except BaseException:
        with contextlib.suppress(OSError):
            core.send([("crashed", traceback.format_exc())])
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
