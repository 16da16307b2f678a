"""A streamed answer of one choice: server-sent events from a running job.

Under `tokenfair serve` the step callback writes each token itself while the client
keeps up (server/chunk_write.py); the response's task writes what it refused, as the
client's socket takes it, within the stream's bound (server/backlog.py), and the end.
"""

from __future__ import annotations

import asyncio

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from tokenfair.engine.engine import RequestOutput
from tokenfair.server.backlog import Unsent, client_too_slow
from tokenfair.server.chunk_write import ChunkWriter, writer_of
from tokenfair.server.generation import Job, timeout_error, tokens_of, watch_disconnect
from tokenfair.server.responses import DONE, ChunkEncoder


class EventStreamResponse(Response):
    """Server-sent events from a running job; a disconnect aborts the job.

    When the server offers a chunk writer (`chunk_write`), the step callback writes
    every token and the end itself while the client keeps up. The response's task
    writes the opening, then whatever the writer refused (the client's socket full, a
    timeout, a cut), as the socket takes it, and the end; past
    `--max-stream-buffer-bytes` waiting for the client it cuts the stream
    (server/backlog.py). Without a writer the task writes every token through `send`.
    """

    media_type = "text/event-stream"

    def __init__(self, job: Job) -> None:
        # Not Response.__init__: it would declare a Content-Length for an empty body.
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", job.request.request_id.encode()),
        ]
        self.job = job
        self.encoder = ChunkEncoder(job)
        self.writer: ChunkWriter | None = None
        # Events the writer could not take when they came; every later one waits behind
        # them, so the step callback must not write past them.
        self.unsent = Unsent()
        self.sent_tokens = 0  # in the events written: the usage of a stream cut short
        self.ended = False  # the response is complete

    def write_through(self, output: RequestOutput) -> bool:
        """The stream's sink: write `output` at once, or refuse and leave it to the task."""
        writer, job = self.writer, self.job
        if (
            writer is None
            or self.unsent.parts  # (not `self.unsent`: no Python call per token)
            or job.timed_out
            or job.cut_by is not None
            or not writer.ready()
        ):
            return False
        job.on_output()
        data = self.encoder.output(output)
        self.sent_tokens += len(output.new_token_ids)
        if not output.finished:
            if data:
                writer.write(data)
            return True
        writer.end(data + self.closing())
        self.ended = job.finished = True
        return True

    def closing(self) -> bytes:
        """The events after the last output: the error the stream ended in, if any, its
        usage when asked (for a stream cut short, of the tokens it was sent), `[DONE]`."""
        job, encoder = self.job, self.encoder
        include_usage = job.prepared.include_usage
        error = job.cut_by
        if error is None and job.timed_out:
            error = timeout_error(job)
        if error is not None:  # cut short: its usage is what it was sent
            events = encoder.error(error.status_code, error.body())
            if include_usage:
                events += encoder.usage(self.sent_tokens)
        else:
            events = encoder.usage() if include_usage else b""
        return events + DONE

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        job, encoder = self.job, self.encoder
        unwatch = watch_disconnect(scope, receive, job)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            opening = encoder.first()
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})
            writer = writer_of(scope)
            if writer is not None:
                await self._relay(writer)
            else:
                await self._send_each(send)
        except OSError:
            job.on_disconnect()
        finally:
            job.stream.sink = None
            unwatch()
            job.close()

    async def _relay(self, writer: ChunkWriter) -> None:
        """Beside the step callback's writes: take what it refused, encoded as it comes
        (its bytes counted), write it once the client's socket has room, end the stream;
        cut the stream when what waits for its client passes the bound."""
        job, encoder, unsent = self.job, self.encoder, self.unsent
        stream = job.stream
        limit = job.state.config.max_stream_buffer_bytes
        self.writer = writer
        writer.on_writable = stream.wake  # write what waits as soon as there is room
        stream.sink = self.write_through
        try:
            while True:
                try:
                    await stream.wait()
                except asyncio.CancelledError:  # the shutdown outlasted its grace: end now
                    job.cancelled()
                if self.ended:  # the step callback wrote the end
                    return
                batch = job.take()
                if job.client_gone:
                    return  # nobody reads: what waits is dropped without being encoded
                unsent.add(encoder.outputs(batch), tokens_of(batch))
                if job.finished or job.cut_by is not None:
                    data, tokens = unsent.take()
                    self.sent_tokens += tokens
                    writer.finish(data + self.closing())
                    self.ended = True
                    return
                if not unsent:
                    continue
                if writer.ready():
                    data, tokens = unsent.take()
                    writer.write(data)
                    self.sent_tokens += tokens
                elif unsent.past(limit, writer):
                    unsent.clear()  # freed now; the client gets the error after what it has
                    job.cut(client_too_slow(limit))
                    job.state.metrics.backpressure.labels(job.request.client).inc()
                    writer.finish(self.closing())
                    self.ended = True
                    return
        finally:
            writer.on_writable = None

    async def _send_each(self, send: Send) -> None:
        """Without a chunk writer (another ASGI server): every output through `send`."""
        job, encoder = self.job, self.encoder
        last = b""
        try:
            while batch := await job.next_batch():
                data = encoder.outputs(batch)
                if job.finished:  # the last chunk leaves with the usage and [DONE]
                    last = data
                    self.sent_tokens += tokens_of(batch)
                    break
                if data:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                self.sent_tokens += tokens_of(batch)
        except asyncio.CancelledError:  # the shutdown outlasted its grace: end now
            job.cancelled()
        await send(
            {"type": "http.response.body", "body": last + self.closing(), "more_body": False}
        )
