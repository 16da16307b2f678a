"""Answers of several choices: `n` > 1, or a list of prompts (each with its `n`).

Each choice is an engine request of its own (its own job: limits, timeout, seat in the
batch, charge to the tenant), prompt by prompt, so choice `i * n + j` is the j-th of
prompt i, as OpenAI numbers them. They run together; the answer gathers them: whole,
or as one event stream whose chunks carry their choice's index, with one usage for
all. A disconnect aborts them all; a timeout of one ends the answer in a 408.
One choice (the usual request) never comes here: routes.py serves it on its fast path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenfair.edge.errors import shutting_down
from tokenfair.server.generation import Job, Prepared, start, timeout_error, watch_disconnect
from tokenfair.server.responses import DONE, ChunkEncoder, LogprobsBuilder, answer_body, usage_of
from tokenfair.server.state import ServerState


class Choices:
    """The jobs of one answer; aborted together when the client goes."""

    def __init__(self, jobs: list[Job], per_prompt: int) -> None:
        self.jobs = jobs
        self.per_prompt = per_prompt

    def on_disconnect(self) -> None:
        for job in self.jobs:
            job.on_disconnect()

    def close(self) -> None:
        for job in self.jobs:
            job.close()

    @property
    def timed_out(self) -> Job | None:
        return next((job for job in self.jobs if job.timed_out), None)


async def start_all(state: ServerState, prepared: list[Prepared], per_prompt: int) -> Choices:
    """Admit and submit every choice, or none: a refusal of one undoes the others."""
    jobs: list[Job] = []
    try:
        for one in prepared:
            jobs.append(await start(state, one))
    except BaseException:
        for job in jobs:
            job.slot.refund()  # the request is refused whole: its choices took no rpm
            job.close()
        raise
    return Choices(jobs, per_prompt)


async def _text_of(job: Job) -> tuple[Job, str, LogprobsBuilder | None]:
    logprobs = (
        LogprobsBuilder(job.state.model.tokenizer, job.prepared.logprobs or 0, job.prepared.chat)
        if job.prepared.logprobs is not None
        else None
    )
    parts: list[str] = []
    while batch := await job.next_batch():
        for output in batch:
            parts.append(output.new_text)
            if logprobs is not None:
                logprobs.add(output)
    return job, "".join(parts), logprobs


async def collect(scope: Scope, receive: Receive, choices: Choices) -> dict[str, Any] | None:
    """The whole answer's body; None when the client left; APIError 408 on a timeout."""
    unwatch = watch_disconnect(scope, receive, choices)
    try:
        texts = await asyncio.gather(*(_text_of(job) for job in choices.jobs))
    finally:
        unwatch()
        choices.close()
    late = choices.timed_out
    if late is not None:
        raise timeout_error(late)
    if any(job.client_gone for job in choices.jobs):
        return None
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

    async def _pump(self, encoder: ChunkEncoder, out: asyncio.Queue[bytes]) -> None:
        job = encoder.job
        while batch := await job.next_batch():
            data = encoder.outputs(batch)
            if data:
                out.put_nowait(data)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        choices = self.choices
        unwatch = watch_disconnect(scope, receive, choices)
        out: asyncio.Queue[bytes] = asyncio.Queue()
        pumps = [asyncio.ensure_future(self._pump(e, out)) for e in self.encoders]
        done = asyncio.ensure_future(asyncio.wait(pumps))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            opening = b"".join(e.first() for e in self.encoders)
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})
            while not (done.done() and out.empty()):
                getting = asyncio.ensure_future(out.get())
                await asyncio.wait((getting, done), return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    continue
                await send(
                    {"type": "http.response.body", "body": getting.result(), "more_body": True}
                )
            await send({"type": "http.response.body", "body": self._end(), "more_body": False})
        except asyncio.CancelledError:  # the shutdown's grace ran out
            end = self.encoders[0].error(503, shutting_down().body()) + DONE
            await send({"type": "http.response.body", "body": end, "more_body": False})
        except OSError:
            choices.on_disconnect()
        finally:
            for pump in pumps:
                pump.cancel()
            done.cancel()
            unwatch()
            choices.close()

    def _end(self) -> bytes:
        choices, first = self.choices, self.encoders[0]
        late = choices.timed_out
        if late is not None:
            return first.error(408, timeout_error(late).body()) + DONE
        if choices.jobs[0].prepared.include_usage:
            usage = usage_of(choices.jobs, choices.per_prompt)
            return first.event_with({"choices": [], "usage": usage}) + DONE
        return DONE
