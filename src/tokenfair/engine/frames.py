"""Messages between the server and its engine process: pickled lists, each framed by a
4-byte length, over a stream socket.

A frame is decoded only once all of it has arrived, and it leaves the buffer before it is
decoded, so a frame that does not unpickle cannot hold up the ones behind it.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("!I")
# Bytes asked of one recv: a step's outputs fit (a few KB); a larger frame takes more
# reads. (A 1 MiB request made every read allocate, and free, a 1 MiB buffer.)
READ_SIZE = 1 << 16


def frame(messages: list[Any]) -> bytes:
    payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


class FrameBuffer:
    """Bytes in, whole messages out."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages of every frame `data` completes, in order (none yet: [])."""
        buffer = self._data
        buffer += data
        messages: list[Any] = []
        while len(buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer)
            end = HEADER.size + size
            if len(buffer) < end:
                break
            payload = bytes(buffer[HEADER.size : end])
            del buffer[:end]  # gone before decoding: a frame that fails cannot jam the rest
            messages.extend(pickle.loads(payload))
        return messages


def read_one(sock: socket.socket, frames: FrameBuffer) -> Any:
    """The first message of a frame holding one, blocking; None at end of file."""
    while True:
        data = sock.recv(READ_SIZE)
        if not data:
            return None
        for message in frames.feed(data):
            return message


def round_trip(value: Any) -> None:
    """Raise unless `value` pickles and unpickles (what the server will do with it)."""
    pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
