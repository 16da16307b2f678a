"""A step's output as it crosses from the engine process to the server: both halves.

The engine process sends, per output, a plain tuple of what the server reads of its
request (a tuple pickles and unpickles several times faster than an object); the
server applies it to its own copy of that request, so the streams and everything after
them see the same RequestOutput as with the engine on a thread. The field order lives
here alone.
"""

from __future__ import annotations

from typing import Any

from tokenfair.core.request import Request
from tokenfair.engine.engine import RequestOutput

WireOutput = tuple[Any, ...]


def wire_output(output: RequestOutput) -> WireOutput:
    """An output as the engine process sends it."""
    request = output.request
    return (
        request.request_id,
        output.new_token_ids,
        output.new_text,
        output.finished,
        output.logprobs,
        request.finish_reason,
        request.first_token_s,
        request.finish_s,
        request.preemptions,
        request.cached_tokens,
    )


def request_id_of(wire: WireOutput) -> str:
    return str(wire[0])


def apply_wire_output(wire: WireOutput, request: Request) -> RequestOutput:
    """The output `wire` (of `request`, the server's copy), with the request brought up
    to date: its new tokens, first-token time, preemptions, prompt tokens found in the
    prefix cache and, at the end, its finish."""
    _, new_ids, new_text, finished, logprobs, reason, first_s, finish_s, preemptions, cached = wire
    request.extend_output(new_ids)
    request.first_token_s = first_s
    request.preemptions = preemptions
    request.cached_tokens = cached
    if finished:
        request.finish_reason = reason
        request.finish_s = finish_s
    return RequestOutput(request, new_ids, new_text, finished, logprobs)
