"""The engine process's side: `python -m tokenfair.engine.engine_core FD`.

Its socket (file descriptor FD, inherited from the server) is its only link. The first
message names a factory (pickled by reference) and its arguments; `factory(**kwargs)`
builds `(card, engine)` here and the card goes back in the ready message. Then the loop
is the engine thread's (`AsyncEngine`): take in requests, aborts and calls; step; send
the step's outputs in one message, each with what the server reads of its request
(wire.py: the server applies it to its own copy).

The process ignores SIGINT, SIGHUP and SIGTERM (a terminal's Ctrl-C or hangup and a
service manager's stop reach the whole process group; the server decides when its
engine stops, after aborting what is in flight). It exits when its socket closes, and
on Linux it is killed with the server even while a model loads, so it never outlives
the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from tokenfair.core.request import FinishReason
from tokenfair.engine.engine import Engine, RequestOutput
from tokenfair.engine.engine_client import delivery_order
from tokenfair.engine.frames import READ_SIZE, FrameBuffer, frame, read_one, round_trip
from tokenfair.engine.wire import wire_output

PR_SET_PDEATHSIG = 1


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
            data = sock.recv(READ_SIZE)
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
            if self.stopping and (aborted := engine.aborted_outputs()):
                replies.append(self.outputs(aborted))  # their last outputs; no more steps
            if replies:  # before the step: a verdict should not wait for it
                self.send(replies)
            if self.stopping:
                return
            outputs = engine.step()
            if outputs:
                self.send([self.outputs(outputs)])

    def outputs(self, outputs: list[RequestOutput]) -> tuple[Any, ...]:
        engine = self.engine
        ordered, urgent = delivery_order(outputs)
        wired = [wire_output(o) for o in ordered]
        return ("outputs", wired, urgent, engine.clock.now(), engine.num_steps)

    def handle(self, messages: list[Any]) -> list[Any]:
        engine = self.engine
        verdicts: list[tuple[str, bool, FinishReason | None]] = []
        replies: list[Any] = []
        for message in messages:
            kind = message[0]
            if kind == "request":
                request = message[1]
                ok = engine.add_request(request)
                verdicts.append((request.request_id, ok, request.finish_reason))
            elif kind == "abort":
                engine.abort(message[1], message[2])
            elif kind == "call":
                replies.append(self.call(message[1], message[2]))
            elif kind == "stop":
                self.stopping = True
        if verdicts:
            replies.insert(0, ("accepted", verdicts, engine.num_steps))
        return replies

    def call(self, call_id: int, fn: Callable[[Engine], Any]) -> tuple[Any, ...]:
        try:
            result = fn(self.engine)
            round_trip(result)
        except Exception as error:
            try:
                round_trip(error)
            except Exception:
                error = RuntimeError(f"{type(error).__name__}: {error}")
            return ("result", call_id, False, error)
        return ("result", call_id, True, result)


def _die_with_parent() -> None:
    """Linux: be killed when the server dies, even while a model loads (after the build,
    the socket's end of file stops the loop as well, on any system)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main(fd: int) -> int:
    # Ctrl-C, a hangup and a service manager's SIGTERM reach the whole process group;
    # the server decides when its engine stops (it aborts what is in flight first).
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    _die_with_parent()
    sock = socket.socket(fileno=fd)
    frames = FrameBuffer()
    build = read_one(sock, frames)
    if build is None:
        return 0
    _, factory, kwargs, log_level = build
    try:
        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
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
