"""Reading a request's body, with one bound and one answer past it (413)."""

from __future__ import annotations

from typing import Any

from tokenfair.edge.errors import APIError, ClientGone, ErrorCode

Receive = Any


def body_too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than {limit} bytes",
        code=ErrorCode.BODY_TOO_LARGE,
    )


async def read_body(receive: Receive, limit: int, declared: str | None = None) -> bytes:
    """The whole body of an ASGI request; 413 past `limit` bytes, checked against the
    declared Content-Length first and then while reading. ClientGone when the client
    disconnects before it has sent it all."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
