"""Streamed chunks written from the engine's step callback, without a task switch.

Through plain ASGI every token of every stream wakes that stream's task, which encodes
the chunk and awaits `send`. At 64 streams and 100 steps a second that is 6,400 task
switches a second, each worth several times the `write` system call itself, and the
last stream of a step waits for all the others before its token leaves.

`tokenfair serve` therefore runs uvicorn (httptools) with `ChunkWriteProtocol`, which
offers every request a synchronous `ChunkWriter` under the scope extension `EXTENSION`
(`scope["extensions"][EXTENSION]["writer"]`): `write(data)` frames `data` as one HTTP
chunk and writes it to the socket at once, `end(data)` writes the last one and
completes the response. The step callback (on the event loop) encodes and writes each
stream's tokens, its end included, itself. `ready()` is False, and the callback writes
nothing, whenever uvicorn's own `send` would do more than that: before the response started,
after it completed, after a disconnect, without chunked encoding, and under
backpressure (the transport paused writing). The caller then hands the outputs to the
stream's task, which holds them until the socket has room again (`on_writable`), so a
slow client never stalls a step, and which can see how much waits in the transport
(`buffered`) to bound what a client that reads too slowly costs. Under another ASGI
server there is no extension and the task path serves every token.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from tokenfair.edge.defaults import DEFAULT_READ_TIMEOUT_S
from tokenfair.edge.read_timeout import ReadTimeoutProtocol
from tokenfair.server.intake import Intake

EXTENSION = "tokenfair.chunk_write"


class ChunkWriter:
    """Synchronous chunk writes for one uvicorn request-response cycle, and the news of
    its client's disconnect."""

    __slots__ = ("counted", "cycle", "intake", "on_disconnect", "on_writable")

    def __init__(self, cycle: Any, intake: Intake | None = None) -> None:
        self.cycle = cycle
        # Called (on the loop) when the connection is lost before the response completed.
        self.on_disconnect: Callable[[], None] | None = None
        # Called (on the loop) when the transport resumes writing: the client has read
        # enough of what waited that the socket has room again.
        self.on_writable: Callable[[], None] | None = None
        self.intake = intake
        self.counted = intake is not None  # in intake.arrived until its handler starts
        if intake is not None:
            intake.arrived += 1

    def handler_started(self) -> None:
        """The request's handler runs: it is no longer waiting to be taken in (once)."""
        if self.counted:
            self.counted = False
            assert self.intake is not None
            self.intake.arrived -= 1

    def watch(self, on_disconnect: Callable[[], None] | None) -> None:
        """Call `on_disconnect` when the client goes away before the response completed
        (at once if it already has); None stops watching. Costs no task, unlike a
        coroutine waiting on `receive` for `http.disconnect`."""
        self.on_disconnect = on_disconnect
        if on_disconnect is not None and self.cycle.disconnected:
            on_disconnect()

    def ready(self) -> bool:
        """Whether a chunk can be written now, exactly as `send` would."""
        cycle = self.cycle
        return not (
            cycle.disconnected
            or cycle.response_complete
            or not cycle.response_started
            or not cycle.chunked_encoding
            or cycle.flow.write_paused
        )

    @property
    def buffered(self) -> int:
        """Bytes written that wait in the transport, beyond what the kernel took."""
        return int(self.cycle.transport.get_write_buffer_size())

    def write(self, data: bytes) -> None:
        """Write `data` as one chunk of the body; only when `ready()`."""
        self.cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end(self, data: bytes) -> None:
        """Write `data` as the body's last chunk and complete the response, as `send`
        does for `more_body: False`; only when `ready()`. The app must send nothing
        after it."""
        cycle = self.cycle
        cycle.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data))
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()

    def finish(self, data: bytes) -> bool:
        """Write `data` as the body's last chunk and complete the response even while
        the client's socket is full (the transport keeps it until the client reads):
        a stream's last few events, so that ending a stream never waits for a slow
        client. False, writing nothing, when the response cannot take a body (not
        started, already complete, the client gone)."""
        cycle = self.cycle
        if (
            cycle.disconnected
            or cycle.response_complete
            or not cycle.response_started
            or not cycle.chunked_encoding
        ):
            return False
        self.end(data)
        return True


def writer_of(scope: MutableMapping[str, Any]) -> ChunkWriter | None:
    """The scope's chunk writer, if the server offers one."""
    extension = scope.get("extensions", {}).get(EXTENSION)
    return None if extension is None else extension.get("writer")


class ChunkWriteProtocol(ReadTimeoutProtocol):
    """uvicorn's httptools protocol (with read timeouts), adding the chunk writer to
    every request's scope. `chunk_write_protocol(intake)` makes one that also counts
    arrivals in `intake`."""

    intake: Intake | None = None
    writer: ChunkWriter | None = None  # the current cycle's

    def on_headers_complete(self) -> None:
        previous = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        # The request's task is created above but runs later: the scope can still grow.
        if cycle is not None and cycle is not previous and cycle.scope is self.scope:
            # Only a request whose task starts now counts as arrived: a pipelined one
            # waits for the response before it, not for the loop.
            started = previous is None or previous.response_complete
            self.writer = ChunkWriter(cycle, self.intake if started else None)
            self.scope.setdefault("extensions", {})[EXTENSION] = {"writer": self.writer}

    def on_response_complete(self) -> None:
        if self.writer is not None:
            self.writer.handler_started()  # (it has: an app that never said so)
        super().on_response_complete()

    def resume_writing(self) -> None:
        super().resume_writing()
        writer = self.writer
        if writer is not None and writer.on_writable is not None:
            writer.on_writable()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        writer = self.writer
        if writer is not None:
            writer.handler_started()  # a task that never got to run (at shutdown)
            if writer.cycle.disconnected and writer.on_disconnect is not None:
                writer.on_disconnect()


def chunk_write_protocol(
    intake: Intake, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
) -> type[ChunkWriteProtocol]:
    """The protocol class for one server, counting its arrivals in `intake`."""
    return type(
        "ChunkWriteProtocol",
        (ChunkWriteProtocol,),
        {"intake": intake, "read_timeout_s": read_timeout_s},
    )
