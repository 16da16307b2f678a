"""The gateway's answer to its client: what has gone out of it (`ClientResponse`), and
an upstream's answer relayed into it while metering it: a body read whole (its usage
settles the charge), or a stream passed on chunk by chunk. Each relay returns how the
request ended, as the metrics count it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from tokenfair.edge.errors import APIError, ErrorCode
from tokenfair.gateway.flow.meter import Meter
from tokenfair.gateway.metrics import Outcome
from tokenfair.gateway.transport.requests import CompletionCall
from tokenfair.gateway.transport.sse import (
    SSEReader,
    error_code_of,
    finish_reason_of,
    text_of_answer,
    usage_of,
)
from tokenfair.gateway.upstreams.client import UpstreamError, UpstreamResponse

if TYPE_CHECKING:
    from tokenfair.edge.tenant_metrics import TenantSeries
    from tokenfair.gateway.flow.tokens import TokenCounter
    from tokenfair.gateway.upstreams.pool import Upstream

# The pool's `mark_failure`: the upstream broke off, and why.
MarkFailure = Callable[["Upstream", str], None]

# What the upstream client raises when an upstream cannot be reached or breaks off (its
# connect timeout is a TimeoutError).
UPSTREAM_ERRORS = (UpstreamError, OSError, TimeoutError)
# A non-streaming answer is read whole before it is relayed (its usage settles the
# charge): past this size it is a 502, not the gateway's memory spent on it.
MAX_ANSWER_BYTES = 64 << 20
UPSTREAM_FAILED = Outcome("error", ErrorCode.UPSTREAM_UNAVAILABLE.value)


Send = Any


class ClientResponse:
    """What has been sent to the client so far."""

    __slots__ = ("complete", "cut_by", "event_stream", "send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.event_stream = False  # relaying server-sent events
        self.complete = False
        # Set when the gateway cuts the request short (its shutdown's grace period is
        # over): the relay ends the stream with it before its task is cancelled.
        self.cut_by: APIError | None = None

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


@dataclass(slots=True)
class Relay:
    """One upstream answer on its way to the client: what a relay reads."""

    mark_failure: MarkFailure  # the pool's: the upstream broke off, and why
    counter: TokenCounter  # the model's token count, where the upstream gives no usage
    series: TenantSeries  # the tenant's latency histograms
    call: CompletionCall
    upstream: Upstream
    up: UpstreamResponse
    headers: list[tuple[bytes, bytes]]  # the answer's headers, as relayed
    meter: Meter
    response: ClientResponse
    arrival: float  # when the request came (perf_counter), for the time to first token


async def relay_body(r: Relay) -> Outcome:
    """A body read whole, then relayed: its usage settles the charge."""
    mark_failure, counter, series = r.mark_failure, r.counter, r.series
    upstream, up, headers, meter, response = r.upstream, r.up, r.headers, r.meter, r.response
    try:
        body = await up.read(MAX_ANSWER_BYTES)
    except UPSTREAM_ERRORS as error:
        mark_failure(upstream, f"response broke off ({type(error).__name__})")
        meter.on_unfinished(failed=True)
        await response.error(
            APIError(
                502,
                f"upstream {upstream.name} broke off its response ({error})",
                type="upstream_error",
                code=ErrorCode.UPSTREAM_UNAVAILABLE,
            )
        )
        return UPSTREAM_FAILED
    answer: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        answer = orjson.loads(body)
    if up.status == 200 and answer is not None:
        usage = usage_of(answer)
        if usage is not None:
            meter.on_usage(*usage)
            meter.streamed = usage[1]
        else:  # no usage: the text the client got is what it pays for
            counted = counter.text(text_of_answer(answer))
            meter.streamed = min(meter.output, counted)
    if up.status != 200 or not meter.usage_seen:
        meter.on_unfinished(failed=up.status != 200)
    else:
        series.ttft.observe(time.perf_counter() - r.arrival)
    await response.start(up.status, [*headers, (b"content-length", str(len(body)).encode())])
    await response.body(body, more=False)
    if up.status == 200:
        return Outcome.finished(finish_reason_of(answer))
    return Outcome.answered(up.status, error_code_of(answer))


async def relay_stream(r: Relay) -> Outcome:
    """A stream passed on chunk by chunk, metered as it goes."""
    mark_failure, counter, series, call = r.mark_failure, r.counter, r.series, r.call
    upstream, up, headers, meter, response = r.upstream, r.up, r.headers, r.meter, r.response
    # Called for every chunk of every stream: what it needs is looked up once here.
    clock, observe_itl, on_chunk = time.perf_counter, series.itl.observe, meter.on_chunk
    last = 0.0  # when the last chunk with tokens came (0: none yet)

    def on_tokens(n: int) -> None:
        nonlocal last
        now = clock()
        if last:
            observe_itl(now - last)
        else:
            series.ttft.observe(now - r.arrival)
        last = now
        on_chunk(n)

    reader = SSEReader(
        counter.chunk, on_tokens, meter.on_usage, hide_usage_chunk=not call.client_wants_usage
    )
    response.event_stream = True
    await response.start(up.status, headers)
    try:
        async for chunk in up:
            out = reader.feed(chunk)
            if out:
                await response.body(out)
    except UPSTREAM_ERRORS as error:
        mark_failure(upstream, f"stream broke off ({type(error).__name__})")
        meter.on_unfinished(failed=True)
        event = APIError(
            502,
            f"upstream {upstream.name} failed mid-stream ({type(error).__name__})",
            type="upstream_error",
            code=ErrorCode.UPSTREAM_UNAVAILABLE,
        )
        await _end_stream(call, reader, meter, response, event)
        return UPSTREAM_FAILED
    except asyncio.CancelledError:
        if response.cut_by is not None and not response.complete:  # the gateway stops
            with contextlib.suppress(OSError):
                await _end_stream(call, reader, meter, response, response.cut_by)
        raise
    await response.body(reader.tail(), more=False)
    if not meter.usage_seen:
        meter.on_unfinished(failed=False)
    if up.status != 200:
        return Outcome.answered(up.status, None)
    if reader.error is not None:  # an error event in the stream
        return Outcome("error", "upstream_error")
    return Outcome.finished(reader.finish_reason)


async def _end_stream(
    call: CompletionCall, reader: SSEReader, meter: Meter, response: ClientResponse, why: APIError
) -> None:
    """End a stream as the server ends one it cuts: the error event, the usage (what the
    tenant is charged) when the client asked for it, and [DONE]."""
    end = b"data: " + orjson.dumps(why.body()) + b"\n\n"
    if call.client_wants_usage:
        end += reader.usage_event(int(meter.prompt), int(meter.output), int(meter.cached))
    await response.body(end + b"data: [DONE]\n\n", more=False)
