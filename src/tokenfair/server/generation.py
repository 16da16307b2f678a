"""From a validated request body to an engine Request, and the job that runs it.

`prepare` tokenizes, applies the tenant's bounds and builds the Request (400 for what
can never run); `start` passes admission control (429/503), submits to the engine
thread and waits for its verdict (a policy rejection such as rpm:N is a 429). The job
then ends one of five ways: finished (stop, length), timed out, client gone, cut (the
shutdown's grace ran out, or its client read too slowly), or aborted by an operator; in
every case the engine frees its slot and blocks before its next step.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.types import Receive, Scope

from tokenfair.core.request import FinishReason, Request
from tokenfair.edge.cache_partition import CachePartition
from tokenfair.edge.errors import APIError, ErrorCode, shutting_down
from tokenfair.edge.limits import WaitingSlot
from tokenfair.edge.tenants import Tenant
from tokenfair.engine.engine import RequestOutput
from tokenfair.engine.engine_client import EngineDeadError
from tokenfair.server.chunk_write import writer_of
from tokenfair.server.model import NoChatTemplateError
from tokenfair.server.protocol import MAX_CHOICES, ChatCompletionRequest, CompletionRequest
from tokenfair.server.sampling import sampling_params, stop_ids
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


def _prompt_ids(state: ServerState, body: Body, prompt: str | list[int] | None) -> list[int]:
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
    assert prompt is not None
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


def _max_tokens(state: ServerState, body: Body, tenant: Tenant, prompt_tokens: int) -> int:
    """The request's max_tokens, within the three bounds on prompt + max_tokens: the
    tenant's, the model's context, and the KV pool (a request that can never fit in it
    would wait forever); APIError 400 past them."""
    model = state.model
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    limit, limit_name = min(
        [
            (tenant.max_tokens_per_request, f"max_tokens_per_request of tenant {tenant.name!r}"),
            (model.max_context, "the model's context length"),
            (model.kv_tokens, "the KV cache (--kv-tokens)"),
        ],
        key=lambda bound: bound[0],
    )
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
    return max_tokens


def cache_salt(tenant: Tenant, proxy: Tenant | None, salt: str | None, shared: bool) -> str | None:
    """What the request's prefix cache is keyed by (None: shared by every tenant).

    A tenant's own request: its partition (edge/cache_partition.py: its name, none with
    `share_prefix_cache`, divided by the request's `cache_salt`). A request a trusted
    proxy sends for a tenant: the proxy's own part of the cache, divided by the
    `cache_salt` the proxy sent or else by the tenant's name. So the proxy decides how
    its tenants share (the gateway sends one salt per tenant, or one for all under its
    own `share_prefix_cache`, by the same rule), and its requests never meet the server's
    own tenants' cache.
    """
    if proxy is not None:
        partition = CachePartition(proxy.name, salt if salt is not None else tenant.name)
    else:
        partition = CachePartition.of(tenant.name, salt, shared)
    return partition.key()


def prepare(
    state: ServerState, body: Body, tenant: Tenant, kind: str, proxy: Tenant | None = None
) -> list[Prepared]:
    """The engine requests of one HTTP request, prompt by prompt, `n` choices each; APIError
    400 for anything that can never run. `proxy`: the trusted proxy that sent it for
    `tenant`, if one did."""
    model = state.model
    salt = cache_salt(tenant, proxy, body.cache_salt, state.tenants.share_prefix_cache)
    if body.model != model.name:
        raise APIError(
            404,
            f"the model {body.model!r} does not exist; this server serves {model.name!r}",
            param="model",
            code="model_not_found",
        )
    chat = isinstance(body, ChatCompletionRequest)
    prompts: list[str | list[int] | None] = (
        [None] if isinstance(body, ChatCompletionRequest) else list(body.prompt_values())
    )
    if len(prompts) * body.choices > MAX_CHOICES:
        raise APIError(
            400,
            f"invalid field 'n': {len(prompts)} prompts x n = {len(prompts) * body.choices} "
            f"choices; at most {MAX_CHOICES} per request",
            param="n",
            code=ErrorCode.INVALID_VALUE,
        )
    logprobs = body.num_logprobs() if isinstance(body, ChatCompletionRequest) else body.logprobs
    eos = stop_ids(body, model.tokenizer.eos_token_ids)
    prepared: list[Prepared] = []
    for prompt in prompts:
        ids = _prompt_ids(state, body, prompt)
        if not ids:
            raise APIError(
                400,
                "the prompt is empty: give at least one token",
                param="messages" if chat else "prompt",
                code=ErrorCode.INVALID_VALUE,
            )
        max_tokens = _max_tokens(state, body, tenant, len(ids))
        for choice in range(body.choices):
            request = Request(
                request_id=state.new_request_id(kind),
                client=tenant.name,
                input_tokens=len(ids),
                arrival_s=state.engine.now(),
                sampling=sampling_params(body, max_tokens, logprobs, choice, model.vocab_size),
                prompt_token_ids=ids if model.keeps_token_ids else None,
                priority=body.priority if body.priority is not None else tenant.priority,
                eos_token_ids=eos,
                cache_salt=salt,
            )
            prepared.append(
                Prepared(
                    request,
                    tenant,
                    chat=chat,
                    stream=bool(body.stream),
                    include_usage=body.include_usage,
                    logprobs=logprobs,
                )
            )
    return prepared


@dataclass(slots=True, eq=False)  # eq=False: compared by identity
class Job:
    """One request in flight, from admission to its last output."""

    state: ServerState
    prepared: Prepared
    slot: WaitingSlot
    timer: asyncio.TimerHandle | None = None
    timed_out: bool = False
    client_gone: bool = False
    finished: bool = False
    cut_by: APIError | None = None  # see cut
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

    @property
    def streaming(self) -> bool:
        return self.prepared.stream

    def cut(self, error: APIError) -> None:
        """End the request now with `error` (the shutdown's grace ran out, its client
        reads too slowly): the engine drops it before its next step, and its stream
        ends at once with the outputs already delivered. A request that has ended
        already, or was cut, stays as it is."""
        if self.cut_by is None and not self.stream.done:
            self.cut_by = error
            self.state.engine.cut(self.request.request_id)

    def cancelled(self) -> None:
        """Its task is being cancelled: the server's shutdown outlasted its grace period
        (and the cut at its end did not reach this request). It ends now, with what it
        was sent and a `shutting_down` error, whatever the engine did meanwhile."""
        self.cut(shutting_down())
        if self.cut_by is None:
            self.cut_by = shutting_down()

    def on_output(self) -> None:
        if self.slot.waiting:
            self.slot.release()  # a first token or the end: no longer waiting

    async def next_batch(self) -> list[RequestOutput]:
        return self._taken(await self.stream.next_batch())

    def take(self) -> list[RequestOutput]:
        """The outputs waiting now, without waiting (see RequestStream.wait)."""
        return self._taken(self.stream.take())

    def _taken(self, batch: list[RequestOutput]) -> list[RequestOutput]:
        if batch or self.stream.done:
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


class Watched(Protocol):
    def on_disconnect(self) -> None: ...


def watch_disconnect(scope: Scope, receive: Receive, job: Watched) -> Callable[[], object]:
    """Abort the job when the client goes away (streaming or not); returns the function
    that stops watching. With the chunk writer (uvicorn under `tokenfair serve`) the
    connection itself reports the loss; elsewhere a task waits on `receive`."""
    writer = writer_of(scope)
    if writer is not None:
        writer.watch(job.on_disconnect)
        return functools.partial(writer.watch, None)
    return asyncio.ensure_future(_receive_disconnect(receive, job)).cancel


async def _receive_disconnect(receive: Receive, job: Watched) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            job.on_disconnect()
            return


def tokens_of(batch: list[RequestOutput]) -> int:
    """The tokens a batch of outputs carries."""
    return sum(len(output.new_token_ids) for output in batch)


def timeout_error(job: Job) -> APIError:
    timeout = job.prepared.tenant.timeout_s or job.state.config.request_timeout_s
    return APIError(
        408, f"the request timed out after {timeout} s", type="timeout_error", code="timeout"
    )
