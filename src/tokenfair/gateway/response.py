"""The gateway's answer to its client, and how much of it has gone out."""

from __future__ import annotations

from typing import Any

import orjson

from tokenfair.edge.errors import APIError

Send = Any


class ClientResponse:
    """What has been sent to the client so far."""

    __slots__ = ("complete", "event_stream", "send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.event_stream = False  # relaying server-sent events
        self.complete = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})
        self.complete = not more

    async def cut_short(self, error: APIError) -> None:
        """End the response with `error`: its whole answer, or a stream's last event."""
        if not self.started:
            await self.error(error)
        elif self.event_stream and not self.complete:
            event = b"data: " + orjson.dumps(error.body()) + b"\n\n"
            await self.body(event + b"data: [DONE]\n\n", more=False)
        elif not self.complete:  # a body that cannot take an event: end it short
            await self.body(b"", more=False)

    async def error(self, error: APIError) -> None:
        body = orjson.dumps(error.body())
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        await self.start(error.status_code, headers)
        await self.body(body, more=False)
