"""A streamed answer: server-sent events from its running choices, one or several.

An answer of one choice (the usual request) and one of several (`n` > 1, or a list of
prompts) stream the same way: each choice's chunks carry its index, one usage event
(when asked) and `[DONE]` end the whole. Under `tokenfair serve` the step callback
writes each token itself while the client keeps up (server/chunk_write.py); the
response's task writes what it refused, as the client's socket takes it, within the
stream's bound (server/backlog.py), and the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from tokenfair.engine.engine import RequestOutput
from tokenfair.server.backlog import Unsent, client_too_slow
from tokenfair.server.choices import Choices
from tokenfair.server.chunk_write import ChunkWriter, writer_of
from tokenfair.server.generation import timeout_error, tokens_of, watch_disconnect
from tokenfair.server.responses import DONE, ChunkEncoder, usage_of


class AnswerStream(Response):
    """Server-sent events from an answer's running choices; a disconnect aborts them all.

    When the server offers a chunk writer (`chunk_write`), the step callback writes
    every token and the end itself while the client keeps up. The response's task
    writes the opening, then whatever the writer refused (the client's socket full, a
    timeout, a cut), as the socket takes it, and the end; past
    `--max-stream-buffer-bytes` waiting for the client it cuts the answer
    (server/backlog.py). Without a writer the task writes every token through `send`.
    One task serves every choice: their streams wake it through one event.
    """

    media_type = "text/event-stream"

    def __init__(self, answer: Choices) -> None:
        # Not Response.__init__: it would declare a Content-Length for an empty body.
        self.status_code = 200
        self.background = None
        self.answer = answer
        first = answer.jobs[0]
        self.encoders = [ChunkEncoder(job, i, first) for i, job in enumerate(answer.jobs)]
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", first.request.request_id.encode()),
        ]
        self.limit = first.state.config.max_stream_buffer_bytes
        self.writer: ChunkWriter | None = None
        # Events the writer could not take when they came, every choice's in order; every
        # later one waits behind them, so the step callback must not write past them.
        self.unsent = Unsent()
        self.sent_tokens = 0  # in the events written: the usage of an answer cut short
        self.ended = False  # the response is complete
        self.unfinished = len(answer.jobs)  # choices whose end the step callback has not written
        # Set by any choice's stream (an output the writer refused, its end, a cut) and
        # by the writer when the client's socket has room again: the first choice's own.
        self.wakeup = first.stream.wakeup
        for job in answer.jobs[1:]:
            job.stream.share_wakeup(self.wakeup)

    def _sink(self, encoder: ChunkEncoder) -> Callable[[RequestOutput], bool]:
        """One choice's sink: write each output at once, or refuse it and leave it, and
        everything after it, to the task."""
        answer, unsent, job = self.answer, self.unsent, encoder.job

        def write_through(output: RequestOutput) -> bool:
            writer = self.writer
            if (
                writer is None
                or unsent.parts  # (not `unsent`: no Python call per token)
                or job.timed_out
                or answer.cut_by is not None
                or not writer.ready()
            ):
                return False
            job.on_output()
            data = encoder.output(output)
            self.sent_tokens += len(output.new_token_ids)
            if not output.finished:
                if data:
                    writer.write(data)
                return True
            job.finished = True
            self.unfinished -= 1
            if not self.unfinished:
                writer.end(data + self._closing())
                self.ended = True
            elif data:
                writer.write(data)
            return True

        return write_through

    def _closing(self) -> bytes:
        """The events after the last outputs: the error the answer ended in, if any, its
        usage when asked (for an answer cut short, of the tokens it was sent), `[DONE]`."""
        answer, first = self.answer, self.encoders[0]
        include_usage = answer.jobs[0].prepared.include_usage
        error = answer.cut_by
        late = answer.timed_out
        if error is None and late is not None:
            error = timeout_error(late)
        sent = None
        events = b""
        if error is not None:  # cut short: its usage is what it was sent
            events = first.error(error.status_code, error.body())
            sent = self.sent_tokens
        if include_usage:
            usage = usage_of(answer.jobs, answer.per_prompt, sent)
            events += first.event_with({"choices": [], "usage": usage})
        return events + DONE

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self.answer
        unwatch = watch_disconnect(scope, receive, answer)
        writer = writer_of(scope)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            opening = b"".join([encoder.first() for encoder in self.encoders])
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})
            if writer is not None:
                self.writer = writer
                writer.on_writable = self.wakeup.set  # write what waits once there is room
                for encoder in self.encoders:
                    encoder.job.stream.sink = self._sink(encoder)
            await self._relay(send)
        except OSError:
            answer.on_disconnect()
        finally:
            if writer is not None:
                writer.on_writable = None
            for job in answer.jobs:
                job.stream.sink = None
            unwatch()
            answer.close()

    async def _relay(self, send: Send) -> None:
        """Beside the step callback's writes: take what it refused, encoded as it comes
        (its bytes counted), write it once the client's socket has room, end the
        answer; cut it when what waits for its client passes the bound."""
        answer, unsent, writer, wakeup = self.answer, self.unsent, self.writer, self.wakeup
        while True:
            try:
                await wakeup.wait()
            except asyncio.CancelledError:  # the shutdown outlasted its grace: end now
                answer.cancelled()
            wakeup.clear()
            if self.ended:  # the step callback wrote the end
                return
            for encoder in self.encoders:
                job = encoder.job
                if job.finished:  # its end is taken already
                    continue
                batch = job.take()
                if batch and not answer.client_gone:
                    unsent.add(encoder.outputs(batch), tokens_of(batch))
                if job.finished:
                    self.unfinished -= 1
            if answer.client_gone:
                return  # nobody reads: what waits is dropped
            if answer.cut_by is not None or not self.unfinished:
                # What waits goes with the end, even to a client whose socket is full:
                # the bound held it, and ending never waits for the client.
                data, tokens = unsent.take()
                self.sent_tokens += tokens
                end = data + self._closing()
                if writer is None:
                    await send({"type": "http.response.body", "body": end, "more_body": False})
                else:
                    writer.finish(end)
                self.ended = True
                return
            if not unsent:
                continue
            if writer is not None and writer.ready():
                data, tokens = unsent.take()
                writer.write(data)
                self.sent_tokens += tokens
            elif unsent.past(self.limit, writer):
                unsent.clear()  # freed now; the client gets the error after what it has
                answer.cut(client_too_slow(self.limit))
                first = answer.jobs[0]
                first.state.metrics.backpressure.labels(first.request.client).inc()
            elif writer is None:  # `send` holds the task while the client is slow
                data, tokens = unsent.take()
                await send({"type": "http.response.body", "body": data, "more_body": True})
                self.sent_tokens += tokens
