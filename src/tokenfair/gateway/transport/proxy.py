"""The completion endpoints: authenticate, queue fairly, forward, stream back, charge.

A raw ASGI handler (the hot path skips the web framework's routing and validation).
While a request waits or streams, a watcher reads the client's side of the connection:
a disconnect cancels the request, which closes the upstream request (vLLM and SGLang
abort on that), frees its capacity and stops its charges. A failure before the first
byte is retried once on another upstream; a failure mid-stream ends the stream with an
error event the OpenAI clients raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from tokenfair.edge.body import read_body
from tokenfair.edge.endpoints import COMPLETION_PATHS
from tokenfair.edge.errors import APIError, ClientGone, ErrorCode, shutting_down
from tokenfair.edge.tenants import ACTING_HEADER
from tokenfair.gateway.flow.meter import Meter
from tokenfair.gateway.flow.ticket import Ticket
from tokenfair.gateway.metrics import ABORTED, Outcome
from tokenfair.gateway.transport.relay import (
    UPSTREAM_ERRORS,
    UPSTREAM_FAILED,
    ClientResponse,
    Relay,
    relay_body,
    relay_stream,
)
from tokenfair.gateway.transport.requests import CompletionCall, parse_call
from tokenfair.gateway.transport.upstream_tenant import for_upstream
from tokenfair.gateway.upstreams.client import UpstreamResponse

if TYPE_CHECKING:
    from tokenfair.core.cost import LinearCost
    from tokenfair.edge.directory import TenantDirectory
    from tokenfair.edge.limits import Limits
    from tokenfair.gateway.config import GatewayConfig
    from tokenfair.gateway.flow.admission import Admission
    from tokenfair.gateway.flow.fairness import Fairness
    from tokenfair.gateway.flow.tokens import TokenCounter
    from tokenfair.gateway.metrics import GatewayMetrics
    from tokenfair.gateway.transport.upstream_tenant import CacheSalts
    from tokenfair.gateway.upstreams.pool import Upstream, UpstreamPool


class ProxyParts(Protocol):
    """What the completion proxy uses of the gateway (app.Gateway has it)."""

    config: GatewayConfig
    directory: TenantDirectory
    pool: UpstreamPool
    admission: Admission
    metrics: GatewayMetrics
    limits: Limits
    cost: LinearCost
    salts: CacheSalts

    def token_counter(self, model: str) -> TokenCounter: ...

    def fairness(self, band: int) -> Fairness: ...


log = logging.getLogger("tokenfair.gateway")

_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"content-length",
    b"content-encoding",
    b"date",
    b"server",
}
_UPSTREAM_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_ACTING = ACTING_HEADER.encode("latin-1")
TIMED_OUT = Outcome("error", ErrorCode.TIMEOUT.value)

Scope = dict[str, Any]
Receive = Any
Send = Any


class CompletionProxy:
    def __init__(self, gateway: ProxyParts) -> None:
        self.gw = gateway
        # The requests being served (waiting, or relaying), with what went out of each.
        self._serving: dict[asyncio.Future[None], ClientResponse] = {}

    def cut_at_shutdown(self) -> None:
        """The shutdown's grace period is over: end every request still served (a stream
        with a `shutting_down` event, its usage when asked, `[DONE]`; else a 503), so
        that the server's shutdown then finds nothing left to cancel."""
        serving = list(self._serving.items())
        streams = sum(response.event_stream for _, response in serving)
        for work, response in serving:
            response.cut_by = shutting_down()
            work.cancel()
        if serving:
            log.info(
                "shutting down: %d streams and %d other requests still running after the "
                "grace period were cut",
                streams,
                len(serving) - streams,
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = ClientResponse(send)
        arrival = time.perf_counter()
        tenant = None
        try:
            tenant = self._authenticate(scope)
            call, tenant, prompt = await self._admit_checks(scope, receive, tenant)
        except APIError as error:
            if tenant is not None:  # a 4xx for this tenant's request: refused, not served
                self.gw.metrics.reject(tenant.name, error.code or f"http_{error.status_code}")
            # The traceback's frames hold the body read and parsed: let them go before the
            # answer is sent, which may wait on a slow client (32 refused prompts of
            # 500,000 token ids held 623 MB while their 400s went out).
            error.__traceback__ = None
            await response.error(error)
            return
        except ClientGone:  # the client left while sending its body
            return
        work = asyncio.ensure_future(self._serve(call, tenant, prompt, response, arrival))
        self._serving[work] = response
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # uvicorn's own timeout, past the cut: a backstop
            response.cut_by = response.cut_by or shutting_down()
        finally:
            watcher.cancel()
            if not work.done():  # the client is gone, or the gateway stops: abandon it
                work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            del self._serving[work]
        if response.cut_by is not None and not response.complete:
            with contextlib.suppress(OSError):
                await response.cut_short(response.cut_by)

    @staticmethod
    async def _watch(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    def _authenticate(self, scope: Scope) -> Any:
        directory = self.gw.directory
        if directory.open_mode or directory.file.trusted_tenant_header is None:
            # Only the key and the acting header are read: no mapping of every header.
            authorization = acting = None
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value
                elif name == _ACTING:
                    acting = value
            key = authorization.decode("latin-1") if authorization is not None else None
            headers = {} if acting is None else {ACTING_HEADER: acting.decode("latin-1")}
            return directory.authenticate(key, headers)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        return directory.authenticate(headers.get("authorization"), headers)

    async def _admit_checks(
        self, scope: Scope, receive: Receive, tenant: Any
    ) -> tuple[CompletionCall, Any, int]:
        """The call read and checked, its tenant, and its prompt tokens."""
        gw = self.gw
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        body = await read_body(
            receive, gw.config.max_body_bytes, declared.decode("latin-1") if declared else None
        )
        call = parse_call(body, COMPLETION_PATHS[scope["path"]])
        del body  # parsed: the bytes are not needed again
        tenant = gw.directory.for_user(tenant, call.user)
        if not gw.pool.serves(call.model):
            raise APIError(
                404,
                f"the model {call.model!r} does not exist on this gateway",
                param="model",
                code=ErrorCode.MODEL_NOT_FOUND,
            )
        # Counted here, so that a prompt too long for its tenant is refused while its
        # parsed body (four times its JSON for token ids) can be let go first.
        prompt, longest = self._prompt_tokens(call)
        prompt, longest = max(1, prompt), max(1, longest)
        per_choice = call.max_tokens or gw.config.default_max_tokens
        if longest + per_choice > tenant.max_tokens_per_request:
            raise APIError(
                400,
                f"prompt ({longest} tokens) + max_tokens ({per_choice}) is over this "
                f"tenant's limit of {tenant.max_tokens_per_request} tokens",
                param="max_tokens",
                code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            )
        return call, tenant, prompt

    def _prompt_tokens(self, call: CompletionCall) -> tuple[int, int]:
        """The prompt tokens of the call, and of its longest prompt (a completions
        prompt may be a batch of prompts)."""
        counter = self.gw.token_counter(call.model)
        if call.kind == "chat":
            tokens = counter.messages(call.payload)
            return tokens, tokens
        if call.choices > 1 and isinstance(call.payload, list):
            each = [counter.prompt(p) for p in call.payload if isinstance(p, str | list)]
            if len(each) == len(call.payload):  # a batch, not one prompt of token ids
                return sum(each), max(each)
        tokens = counter.prompt(call.payload)
        return tokens, tokens

    async def _serve(
        self,
        call: CompletionCall,
        tenant: Any,
        prompt: int,
        response: ClientResponse,
        arrival: float,
    ) -> None:
        gw = self.gw
        per_choice = call.max_tokens or gw.config.default_max_tokens
        max_tokens = per_choice * call.choices  # output reserved for every choice
        try:
            if not gw.pool.any_eligible(call.model):
                raise APIError(
                    503,
                    f"no upstream serving {call.model!r} is in rotation; retry later",
                    code=ErrorCode.NO_UPSTREAM,
                    headers={"Retry-After": "1"},
                )
            slot = gw.limits.admit(tenant, time.monotonic())
        except APIError as refused:
            gw.metrics.reject(tenant.name, refused.code or f"http_{refused.status_code}")
            await response.error(refused)
            return
        meter = Meter(
            gw.fairness(tenant.band),
            gw.directory.path_weights(tenant),
            gw.cost,
            prompt,
            max_tokens,
            call.stream,
            gw.config.cost.charge_cached_tokens,
        )
        ticket = Ticket(
            tenant=tenant.name,
            model=call.model,
            tokens=prompt + max_tokens,
            seats=call.choices,
            charge=meter.dispatch_charge(),
            priority=call.priority if call.priority is not None else tenant.priority,
            max_tokens=max_tokens,
            band=tenant.band,
            prefix=gw.pool.router.key(tenant.name, call.model, call.kind, call.payload),
        )
        outcome: Outcome | None = ABORTED  # None: refused, counted as such already
        try:
            async with asyncio.timeout(tenant.timeout_s or gw.config.request_timeout_s):
                try:
                    await gw.admission.wait(ticket)
                except APIError as refused:  # the policy's own rate (rpm:N)
                    gw.metrics.reject(tenant.name, refused.code or "rate_limit_exceeded")
                    await response.error(refused)
                    outcome = None
                    return
                finally:
                    slot.release()  # dispatched, refused or gone: no longer waiting
                gw.metrics.of(tenant.name).queue.observe(time.perf_counter() - arrival)
                outcome = await self._forward(call, ticket, meter, response, arrival, tenant.name)
        except TimeoutError:
            outcome = TIMED_OUT
            if not response.started:
                await response.error(
                    APIError(
                        408, "the request timed out", type="timeout_error", code=ErrorCode.TIMEOUT
                    )
                )
            else:  # mid-stream: an event the client can tell from a whole answer
                with contextlib.suppress(Exception):
                    await response.cut_short(
                        APIError(
                            408,
                            "the request timed out",
                            type="timeout_error",
                            code=ErrorCode.TIMEOUT,
                        )
                    )
        finally:
            gw.admission.release(ticket)
            # Charged at dispatch: a request that left the queue before it was paid for
            # nothing, and must get nothing back (its reservation is not a charge).
            dispatched = ticket.upstream is not None
            if outcome in (ABORTED, TIMED_OUT) and dispatched:
                meter.on_unfinished(failed=False)
            if outcome is not None:
                gw.metrics.finished(
                    tenant.name,
                    outcome,
                    meter.prompt if dispatched else 0,
                    meter.output if dispatched else 0,
                    meter.service() if dispatched else 0.0,
                    time.perf_counter() - arrival,
                )

    async def _send(
        self, upstream: Upstream, call: CompletionCall, tenant: str
    ) -> tuple[UpstreamResponse | None, BaseException | None]:
        gw = self.gw
        body, headers = for_upstream(
            call, tenant, upstream.config.engine, gw.salts, gw.directory.share_prefix_cache
        )
        try:
            return await upstream.client.request(
                "POST", _UPSTREAM_PATHS[call.kind], body, headers
            ), None
        except UPSTREAM_ERRORS as error:
            self.gw.pool.mark_failure(upstream, f"request failed ({type(error).__name__})")
            return None, error

    async def _open(
        self, call: CompletionCall, ticket: Ticket
    ) -> tuple[UpstreamResponse | None, BaseException | None]:
        """Send the request; after a failure before the first byte, once more elsewhere.

        With no other upstream for the model, the client gets the upstream's own 5xx
        answer (or a 502 when it could not be reached).
        """
        gw = self.gw
        for attempt in (0, 1):
            upstream = ticket.upstream
            assert upstream is not None
            response, failure = await self._send(upstream, call, ticket.tenant)
            if response is not None and response.status < 500:
                gw.pool.mark_success(upstream)
                return response, None
            if response is not None:  # a failed request counts against its health
                gw.pool.mark_failure(upstream, f"answered {response.status}")
            if attempt == 1 or not gw.pool.any_eligible(
                call.model, ticket.exclude | {upstream.name}
            ):
                return response, failure
            if response is not None:
                response.release()  # not read: closes its connection
            if await gw.admission.retry(ticket) is None:
                return None, failure
            gw.metrics.retries.inc()
        raise AssertionError("unreachable")

    async def _forward(
        self,
        call: CompletionCall,
        ticket: Ticket,
        meter: Meter,
        response: ClientResponse,
        arrival: float,
        tenant: str,
    ) -> Outcome:
        upstream_response, failure = await self._open(call, ticket)
        upstream = ticket.upstream
        assert upstream is not None
        if upstream_response is None:
            meter.on_unfinished(failed=True)
            name = type(failure).__name__ if failure is not None else "error"
            await response.error(
                APIError(
                    502,
                    f"upstream {upstream.name} failed: {name}",
                    type="upstream_error",
                    code=ErrorCode.UPSTREAM_UNAVAILABLE,
                )
            )
            return UPSTREAM_FAILED
        try:
            headers = [
                (k.lower(), v)
                for k, v in upstream_response.raw_headers
                if k.lower() not in _HOP_BY_HOP
            ]
            content_type = upstream_response.header(b"content-type") or b""
            relay = relay_stream if content_type.startswith(b"text/event-stream") else relay_body
            gw = self.gw
            counter, series = gw.token_counter(call.model), gw.metrics.of(tenant)
            return await relay(Relay(
                gw.pool.mark_failure, counter, series, call, upstream, upstream_response,
                headers, meter, response, arrival,
            ))  # fmt: skip
        finally:
            # A response read to its end goes back to the keep-alive pool; one abandoned
            # (client gone, timeout) closes its connection, which aborts it upstream.
            upstream_response.release()
