"""The choices of one answer: one (the usual request), or several (`n` > 1, or a list
of prompts, each with its `n`).

Each choice is an engine request of its own (its own job: limits, timeout, seat in the
batch, charge to the tenant), prompt by prompt, so choice `i * n + j` is the j-th of
prompt i, as OpenAI numbers them. They run together; the answer gathers them: whole
(`collect`), or as one event stream whose chunks carry their choice's index, with one
usage for all (server/answer_stream.py). A disconnect aborts them all; a timeout of one
ends the answer in a 408; a cut (the shutdown's grace ran out, or a client reading too
slowly: server/backlog.py) cuts them all.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope

from tokenfair.edge.errors import APIError, shutting_down
from tokenfair.engine.engine import RequestOutput
from tokenfair.server.generation import Job, Prepared, start, timeout_error, watch_disconnect
from tokenfair.server.responses import LogprobsBuilder, answer_body
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
    if len(prepared) == 1:
        return Choices([await start(state, prepared[0])], per_prompt)
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
        jobs = choices.jobs
        if len(jobs) == 1:  # (no task for the usual request)
            texts = [await text_of(jobs[0])]
        else:
            texts = await asyncio.gather(*(text_of(job) for job in jobs))
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
    return answer_body(texts, choices.per_prompt)
