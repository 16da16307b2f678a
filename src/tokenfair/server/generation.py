"""From a validated request body to an engine Request, and the job that runs it.

`prepare` tokenizes, applies the tenant's bounds and builds the Request (400 for what
can never run); `start` passes admission control (429/503), submits to the engine
thread and waits for its verdict (a policy rejection such as rpm:N is a 429). The job
then ends one of four ways: finished (stop, length), timed out, client gone, or aborted
by an operator; in every case the engine frees its slot and blocks before its next step.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope

from tokenfair.core.request import FinishReason, Request, SamplingParams
from tokenfair.edge.errors import APIError, ErrorCode
from tokenfair.edge.limits import WaitingSlot
from tokenfair.edge.tenants import Tenant
from tokenfair.engine.engine import RequestOutput
from tokenfair.engine.engine_client import EngineDeadError
from tokenfair.server.chunk_write import writer_of
from tokenfair.server.model import NoChatTemplateError
from tokenfair.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenfair.server.state import ServerState

Body = CompletionRequest | ChatCompletionRequest


@dataclass(slots=True)
class Prepared:
    request: Request
    tenant: Tenant
    chat: bool
    stream: bool
    include_usage: bool
    logprobs: int | None


def _prompt_ids(state: ServerState, body: Body) -> list[int]:
    model = state.model
    if isinstance(body, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            return model.chat_ids(messages)
        except NoChatTemplateError as error:
            raise APIError(400, str(error), param="messages", code="no_chat_template") from None
        except Exception as error:  # a template that rejects these messages (jinja raises)
            raise APIError(
                400,
                f"the chat template cannot render these messages: {error}",
                param="messages",
                code=ErrorCode.INVALID_VALUE,
            ) from None
    prompt = body.prompt_value()
    if isinstance(prompt, str):
        return model.tokenizer.encode(prompt)
    vocab = model.vocab_size
    if vocab is not None:
        for token in prompt:
            if token >= vocab:
                raise APIError(
                    400,
                    f"token id {token} in prompt is outside the vocabulary (size {vocab})",
                    param="prompt",
                    code=ErrorCode.INVALID_VALUE,
                )
    return list(prompt)


def prepare(state: ServerState, body: Body, tenant: Tenant, kind: str) -> Prepared:
    """Build the engine request; APIError 400 for anything that can never run."""
    model = state.model
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    if body.model != model.name:
        raise APIError(
            404,
            f"the model {body.model!r} does not exist; this server serves {model.name!r}",
            param="model",
            code="model_not_found",
        )
    ids = _prompt_ids(state, body)
    if not ids:
        raise APIError(
            400,
            "the prompt is empty: give at least one token",
            param=param,
            code=ErrorCode.INVALID_VALUE,
        )
    prompt_tokens = len(ids)
    # The three bounds on prompt + max_tokens: the tenant's, the model's context, and
    # the KV pool (a request that can never fit in it would wait forever).
    bounds = sorted(
        [
            (tenant.max_tokens_per_request, f"max_tokens_per_request of tenant {tenant.name!r}"),
            (model.max_context, "the model's context length"),
            (model.kv_tokens, "the KV cache (--kv-tokens)"),
        ],
        key=lambda bound: bound[0],
    )
    limit, limit_name = bounds[0]
    limit_name = f"{limit_name} ({limit} tokens)"
    if prompt_tokens >= limit:
        raise APIError(
            400,
            f"the prompt has {prompt_tokens} tokens; prompt + max_tokens must fit in {limit_name}",
            param=param,
            code="context_length_exceeded",
        )
    asked = body.token_limit() if isinstance(body, ChatCompletionRequest) else body.max_tokens
    max_tokens = (
        asked if asked is not None else min(state.config.default_max_tokens, limit - prompt_tokens)
    )
    if prompt_tokens + max_tokens > limit:
        asked_by = (
            "max_completion_tokens"
            if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None
            else "max_tokens"
        )
        raise APIError(
            400,
            f"prompt ({prompt_tokens} tokens) + {asked_by} ({max_tokens}) = "
            f"{prompt_tokens + max_tokens} tokens is more than {limit_name}; lower {asked_by}",
            param=asked_by,
            code="context_length_exceeded",
        )
    logprobs = body.num_logprobs() if isinstance(body, ChatCompletionRequest) else body.logprobs
    try:
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature if body.temperature is not None else 1.0,
            top_p=body.top_p if body.top_p is not None else 1.0,
            top_k=body.top_k or 0,
            seed=body.seed,
            stop=body.stop_strings(),
            ignore_eos=bool(body.ignore_eos),
            logprobs=logprobs,
        )
    except ValueError as error:
        raise APIError(400, str(error), code=ErrorCode.INVALID_VALUE) from None
    request = Request(
        request_id=state.new_request_id(kind),
        client=tenant.name,
        input_tokens=prompt_tokens,
        arrival_s=state.engine.now(),
        sampling=sampling,
        prompt_token_ids=ids if model.keeps_token_ids else None,
        priority=body.priority if body.priority is not None else tenant.priority,
        eos_token_ids=model.tokenizer.eos_token_ids,
        cache_salt=None if state.tenants.share_prefix_cache else tenant.name,
    )
    return Prepared(
        request,
        tenant,
        chat=isinstance(body, ChatCompletionRequest),
        stream=bool(body.stream),
        include_usage=body.include_usage,
        logprobs=logprobs,
    )


@dataclass(slots=True)
class Job:
    """One request in flight, from admission to its last output."""

    state: ServerState
    prepared: Prepared
    slot: WaitingSlot
    timer: asyncio.TimerHandle | None = None
    timed_out: bool = False
    client_gone: bool = False
    finished: bool = False
    stream: Any = None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def request(self) -> Request:
        return self.prepared.request

    def on_timeout(self) -> None:
        self.timed_out = True
        self.state.metrics.timed_out(self.request.request_id)
        self.state.engine.abort(self.request.request_id)

    def on_disconnect(self) -> None:
        if not self.finished:
            self.client_gone = True
            self.state.engine.abort(self.request.request_id)

    def on_output(self) -> None:
        if self.slot.waiting:
            self.slot.release()  # a first token or the end: no longer waiting

    async def next_batch(self) -> list[RequestOutput]:
        batch = await self.stream.next_batch()
        self.on_output()
        if not batch or batch[-1].finished:
            self.finished = True
        return batch

    def close(self) -> None:
        """Always called last: stop the timer, free the admission, abort if unfinished."""
        if self.timer is not None:
            self.timer.cancel()
        self.slot.release()
        if not self.finished and not self.stream.done:
            self.client_gone = True
            self.state.engine.abort(self.request.request_id)

    @property
    def finish_reason(self) -> str:
        reason = self.request.finish_reason
        if reason is None:
            return "abort"
        return "abort" if reason is FinishReason.REJECTED else reason.value


async def start(state: ServerState, prepared: Prepared) -> Job:
    """Admit and submit; return the running job or raise APIError (429, 503)."""
    tenant = prepared.tenant
    try:
        slot = state.limits.admit(tenant, time.monotonic())
    except APIError as error:
        state.metrics.reject(tenant.name, error.code or str(error.status_code))
        raise
    job = Job(state, prepared, slot)
    try:
        job.stream = state.engine.submit(prepared.request)
        state.metrics.arrived(prepared.request.request_id, state.engine.num_steps)
        accepted = await job.stream.accepted
    except EngineDeadError:
        slot.release()
        state.metrics.fail(tenant.name, "engine_dead")
        raise APIError(503, "the engine is not running", code="engine_dead") from None
    except BaseException:
        slot.release()
        if job.stream is not None:
            state.engine.abort(prepared.request.request_id)
        raise
    if not accepted:
        slot.release()
        state.metrics.reject(tenant.name, "rate_limit_exceeded")
        raise APIError(
            429,
            f"the scheduling policy ({state.model.policy_name}) refused this "
            f"request for tenant {tenant.name!r}; retry later",
            code="rate_limit_exceeded",
            headers={"Retry-After": "1"},
        )
    timeout = tenant.timeout_s if tenant.timeout_s is not None else state.config.request_timeout_s
    if timeout is not None:
        job.timer = asyncio.get_running_loop().call_later(timeout, job.on_timeout)
    return job


def watch_disconnect(scope: Scope, receive: Receive, job: Job) -> Callable[[], object]:
    """Abort the job when the client goes away (streaming or not); returns the function
    that stops watching. With the chunk writer (uvicorn under `tokenfair serve`) the
    connection itself reports the loss; elsewhere a task waits on `receive`."""
    writer = writer_of(scope)
    if writer is not None:
        writer.watch(job.on_disconnect)
        return functools.partial(writer.watch, None)
    return asyncio.ensure_future(_receive_disconnect(receive, job)).cancel


async def _receive_disconnect(receive: Receive, job: Job) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            job.on_disconnect()
            return


def timeout_error(job: Job) -> APIError:
    timeout = job.prepared.tenant.timeout_s or job.state.config.request_timeout_s
    return APIError(
        408, f"the request timed out after {timeout} s", type="timeout_error", code="timeout"
    )
