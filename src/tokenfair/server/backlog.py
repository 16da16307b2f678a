"""What a stream holds for a client that reads slower than its tokens come, and its bound.

The engine never waits for a reader (a slow client must not stall everyone's step), so
a stream's events queue in the server while its client's socket is full. Unbounded,
a client reading at 1 KB/s while 128 choices stream into it costs the server megabytes
a second. So each stream's backlog is bounded (`--max-stream-buffer-bytes`): the
events encoded and not written yet, plus what waits in the connection's transport
beyond the kernel's socket buffer. Past the bound the stream is cut: its engine
requests are aborted (their seats and KV blocks free at the next step), what waited is
dropped, and the client, should it read on, finds an error event and `[DONE]` after
what it was already sent.
"""

from __future__ import annotations

from tokenfair.edge.errors import APIError, ErrorCode
from tokenfair.server.chunk_write import ChunkWriter

# The transport's own high-water mark: below it a client keeping up would be cut.
MIN_STREAM_BUFFER_BYTES = 64 << 10


class Unsent:
    """Events encoded for a client and not written yet, with the tokens they carry."""

    __slots__ = ("parts", "size", "tokens")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.tokens = 0

    def __bool__(self) -> bool:
        return bool(self.parts)

    def add(self, data: bytes, tokens: int) -> None:
        if data:
            self.parts.append(data)
            self.size += len(data)
        self.tokens += tokens

    def take(self) -> tuple[bytes, int]:
        """Everything held, as one write, and its tokens; empties it."""
        data, tokens = b"".join(self.parts), self.tokens
        self.clear()
        return data, tokens

    def past(self, limit: int, writer: ChunkWriter | None) -> bool:
        """Whether what waits for the client, here and in its connection's transport
        (beyond the kernel's buffer), is more than `limit` bytes."""
        return self.size + (writer.buffered if writer is not None else 0) > limit

    def clear(self) -> None:
        self.parts = []
        self.size = 0
        self.tokens = 0


def client_too_slow(limit: int) -> APIError:
    """The error a stream is cut with when its backlog passes `limit` bytes."""
    return APIError(
        400,
        f"the client read this stream too slowly: more than {limit} bytes of events "
        "waited for it in the server (--max-stream-buffer-bytes), so its generation "
        "was stopped",
        code=ErrorCode.CLIENT_TOO_SLOW,
    )
