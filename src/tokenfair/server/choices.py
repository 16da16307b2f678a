"""Answers of several choices: `n` > 1, or a list of prompts (each with its `n`).

Each choice is an engine request of its own (its own job: limits, timeout, seat in the
batch, charge to the tenant), prompt by prompt, so choice `i * n + j` is the j-th of
prompt i, as OpenAI numbers them. They run together; the answer gathers them: whole,
or as one event stream whose chunks carry their choice's index, with one usage for
all. A disconnect aborts them all; a timeout of one ends the answer in a 408; a cut
(the shutdown's grace ran out, or a client reading too slowly: server/backlog.py) cuts
them all. One choice (the usual request) never comes here: routes.py serves it on its fast path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenfair.edge.errors import APIError, shutting_down
from tokenfair.engine.engine import RequestOutput
from tokenfair.server.backlog import Unsent, client_too_slow
from tokenfair.server.chunk_write import ChunkWriter, writer_of
from tokenfair.server.generation import (
    Job,
    Prepared,
    start,
    timeout_error,
    tokens_of,
    watch_disconnect,
)
from tokenfair.server.responses import DONE, ChunkEncoder, LogprobsBuilder, answer_body, usage_of
from tokenfair.server.state import ServerState


class Choices:
    """The jobs of one answer; aborted together when the client goes, cut together."""

    def __init__(self, jobs: list[Job], per_prompt: int) -> None:
        self.jobs = jobs
        self.per_prompt = per_prompt
        self.cut_by: APIError | None = None  # see cut
        self.client_gone = False  # some choice was still running when the client went

    @property
    def streaming(self) -> bool:
        return self.jobs[0].prepared.stream

    def on_disconnect(self) -> None:
        for job in self.jobs:
            job.on_disconnect()
        self.client_gone = any(job.client_gone for job in self.jobs)

    def cut(self, error: APIError) -> None:
        """End the answer now with `error` (see Job.cut); one whose choices have all
        ended already stays as it is."""
        if self.cut_by is None and not all(job.stream.done for job in self.jobs):
            self.cut_by = error
            for job in self.jobs:
                job.cut(error)

    def cancelled(self) -> None:
        """Its task is being cancelled (see Job.cancelled)."""
        self.cut(shutting_down())
        if self.cut_by is None:
            self.cut_by = shutting_down()

    def close(self) -> None:
        self.jobs[0].state.answering.discard(self)
        for job in self.jobs:
            job.close()

    @property
    def timed_out(self) -> Job | None:
        return next((job for job in self.jobs if job.timed_out), None)


async def start_all(state: ServerState, prepared: list[Prepared], per_prompt: int) -> Choices:
    """Admit and submit every choice, or none: a refusal of one undoes the others.
    The metrics count the choices as one request (its refusal, once, by `start`)."""
    ids = [one.request.request_id for one in prepared]
    state.metrics.choices(ids, per_prompt)
    jobs: list[Job] = []
    try:
        for one in prepared:
            jobs.append(await start(state, one))
    except BaseException:
        state.metrics.choices_refused(ids, [job.request.request_id for job in jobs])
        for job in jobs:
            job.slot.refund()  # the request is refused whole: its choices took no rpm
            job.close()
        raise
    return Choices(jobs, per_prompt)


async def text_of(job: Job) -> tuple[Job, str, LogprobsBuilder | None]:
    """A choice's whole text (and logprobs, if asked), as its job produces it. Tokens
    before the last are taken on the step callback, with no task wake-up per step."""
    logprobs = (
        LogprobsBuilder(job.state.model.tokenizer, job.prepared.logprobs or 0, job.prepared.chat)
        if job.prepared.logprobs is not None
        else None
    )
    parts: list[str] = []

    def take(output: RequestOutput) -> None:
        parts.append(output.new_text)
        if logprobs is not None:
            logprobs.add(output)

    def take_early(output: RequestOutput) -> bool:
        if output.finished:
            return False
        job.on_output()
        take(output)
        return True

    job.stream.sink = take_early
    try:
        while batch := await job.next_batch():
            for output in batch:
                take(output)
    finally:
        job.stream.sink = None
    return job, "".join(parts), logprobs


async def collect(scope: Scope, receive: Receive, choices: Choices) -> dict[str, Any] | None:
    """The whole answer's body; None when the client left; APIError 408 on a timeout."""
    unwatch = watch_disconnect(scope, receive, choices)
    try:
        texts = await asyncio.gather(*(text_of(job) for job in choices.jobs))
    finally:
        unwatch()
        choices.close()
    late = choices.timed_out
    if late is not None:
        raise timeout_error(late)
    if choices.client_gone:
        return None
    if choices.cut_by is not None:
        raise choices.cut_by
    return answer_body(list(texts), choices.per_prompt)


class ChoicesStream(Response):
    """The answer as server-sent events: every choice's chunks as they come, then one
    usage chunk (if asked) and [DONE]."""

    media_type = "text/event-stream"

    def __init__(self, choices: Choices) -> None:
        # Not Response.__init__: it would declare a Content-Length for an empty body.
        self.status_code = 200
        self.background = None
        self.choices = choices
        first = choices.jobs[0]
        self.encoders = [ChunkEncoder(job, i, first) for i, job in enumerate(choices.jobs)]
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", first.request.request_id.encode()),
        ]
        self.limit = first.state.config.max_stream_buffer_bytes
        self.unsent = Unsent()  # every choice's events encoded, in order, not written yet
        self.sent_tokens = 0  # in the events written: the usage of an answer cut short
        self.running = len(self.encoders)  # choices whose pumps still run
        # Set for the sender: events wait, a choice ended, or the socket has room again.
        self.wakeup = asyncio.Event()
        self.writer: ChunkWriter | None = None

    async def _pump(self, encoder: ChunkEncoder) -> None:
        """One choice's events, encoded as they come, for the sender; the answer is cut
        when what waits for its client passes the bound."""
        choices, unsent = self.choices, self.unsent
        job = encoder.job
        try:
            while batch := await job.next_batch():
                if choices.client_gone or choices.cut_by is not None:
                    continue  # never to be written: not encoded
                unsent.add(encoder.outputs(batch), tokens_of(batch))
                self.wakeup.set()
                writer = self.writer
                # With a writer, only while the client's socket is full: a sender that has
                # yet to run is not a slow client. Without one, the sender is held up in
                # `send` by the client, or will write it all at once.
                if (writer is None or not writer.ready()) and unsent.past(self.limit, writer):
                    unsent.clear()  # freed now; the client gets the error after what it has
                    choices.cut(client_too_slow(self.limit))
                    job.state.metrics.backpressure.labels(job.request.client).inc()
        finally:
            self.running -= 1
            self.wakeup.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        choices, unsent = self.choices, self.unsent
        unwatch = watch_disconnect(scope, receive, choices)
        writer = self.writer = writer_of(scope)
        pumps = [asyncio.ensure_future(self._pump(e)) for e in self.encoders]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            opening = b"".join(e.first() for e in self.encoders)
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})
            if writer is not None:
                writer.on_writable = self.wakeup.set  # the client's socket has room again
            try:
                while True:
                    await self.wakeup.wait()
                    self.wakeup.clear()
                    if choices.client_gone:
                        return  # nobody reads: what waits is dropped
                    if not self.running or choices.cut_by is not None:
                        break
                    if unsent and (writer is None or writer.ready()):
                        data, tokens = unsent.take()
                        if writer is None:
                            await send(
                                {"type": "http.response.body", "body": data, "more_body": True}
                            )
                        else:
                            writer.write(data)
                        self.sent_tokens += tokens
            except asyncio.CancelledError:  # the shutdown outlasted its grace: end now
                choices.cancelled()
            # What waits goes with the end, even to a client whose socket is full: the
            # bound held it, and ending never waits for the client.
            data, tokens = unsent.take()
            self.sent_tokens += tokens
            end = data + self._closing()
            if writer is None:
                await send({"type": "http.response.body", "body": end, "more_body": False})
            else:
                writer.finish(end)
        except OSError:
            choices.on_disconnect()
        finally:
            if writer is not None:
                writer.on_writable = None
            for pump in pumps:
                pump.cancel()
            unwatch()
            choices.close()

    def _closing(self) -> bytes:
        """The events after the last outputs: the error the answer ended in, if any, the
        usage when asked (for an answer cut short, of the tokens it was sent), `[DONE]`."""
        choices, first = self.choices, self.encoders[0]
        include_usage = choices.jobs[0].prepared.include_usage
        late = choices.timed_out
        error = choices.cut_by
        if error is None and late is not None:
            error = timeout_error(late)
        if error is not None:  # cut short: its usage is what it was sent
            events = first.error(error.status_code, error.body())
            if include_usage:
                usage = usage_of(choices.jobs, choices.per_prompt, self.sent_tokens)
                events += first.event_with({"choices": [], "usage": usage})
            return events + DONE
        if include_usage:
            usage = usage_of(choices.jobs, choices.per_prompt)
            return first.event_with({"choices": [], "usage": usage}) + DONE
        return DONE
