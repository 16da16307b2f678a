"""Result files: what happened to each request of a replay, one JSON object a line.

Fields (all times are absolute seconds on the replay's clock, the same clock as the
trace's `arrival_s`; a time is null when the request never reached that point):

- `request_id`, `client`, `arrival_s`, `input_tokens`;
- `output_tokens`: tokens actually generated (may be fewer than the trace asked for
  when the request was aborted or hit its length limit);
- `scheduled_s`: first admission to the running batch;
- `first_token_s`: when its first output token was produced (TTFT = first_token_s -
  arrival_s);
- `finish_s`: when it left the system (finished, aborted or rejected);
- `status`: the request's final lifecycle status, e.g. "finished";
- `finish_reason`: "stop", "length", "abort", "rejected", or null if it never ended
  (the replay stopped first);
- `preemptions`: how many times it was pushed out of the batch;
- `requested_output_tokens`: the output length the trace asked for (its `output_tokens`),
  null when unknown; compare it with `output_tokens` to see which requests were cut
  short;
- `cached_tokens`: prompt tokens found in the prefix cache at its first admission, so
  not prefilled (0 without prefix caching, or when it never ran).

The engine's replays write these records (`result_from_request`), the fairness metrics
(tokenfair.fairness) read them. Unknown fields are ignored; bad lines raise
`ResultError` naming the file and line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenfair.core.request import Request
from tokenfair.workloads.jsonl import (
    FieldError,
    JsonlLineError,
    check_float,
    check_int,
    check_optional_float,
    check_optional_int,
    check_str,
    parse_records,
    read_lines,
    require,
    show,
    write_objects,
)

FINISH_REASONS = ("stop", "length", "abort", "rejected")


class ResultError(JsonlLineError):
    """A result line is invalid: str() reads like `results.jsonl:3: finish_s must ...`."""


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """The outcome of one request. Construction validates every field (ValueError)."""

    request_id: str
    client: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    status: str = "finished"
    finish_reason: str | None = None
    preemptions: int = 0
    requested_output_tokens: int | None = None
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        check_str("request_id", self.request_id)
        check_str("client", self.client)
        check_float("arrival_s", self.arrival_s, 0.0)
        check_int("input_tokens", self.input_tokens, 1)
        check_int("output_tokens", self.output_tokens, 0)
        check_str("status", self.status)
        check_finish_reason(self.finish_reason)
        check_int("preemptions", self.preemptions, 0)
        check_optional_int("requested_output_tokens", self.requested_output_tokens, 0)
        check_int("cached_tokens", self.cached_tokens, 0)
        if self.cached_tokens > self.input_tokens:
            raise FieldError(
                f"cached_tokens ({self.cached_tokens}) is more than input_tokens "
                f"({self.input_tokens})"
            )
        check_times(self.arrival_s, self.scheduled_s, self.first_token_s, self.finish_s)

    @property
    def served(self) -> bool:
        """True when the request produced output (it contributes service)."""
        return self.first_token_s is not None and self.finish_s is not None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, measured from arrival."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "client": self.client,
            "arrival_s": self.arrival_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "scheduled_s": self.scheduled_s,
            "first_token_s": self.first_token_s,
            "finish_s": self.finish_s,
            "status": self.status,
            "finish_reason": self.finish_reason,
            "preemptions": self.preemptions,
            "requested_output_tokens": self.requested_output_tokens,
            "cached_tokens": self.cached_tokens,
        }


def check_finish_reason(value: Any) -> str | None:
    if value is not None and value not in FINISH_REASONS:
        allowed = ", ".join(f'"{r}"' for r in FINISH_REASONS)
        raise FieldError(f"finish_reason must be one of {allowed} or null, got {show(value)}")
    return value


def check_times(
    arrival_s: float,
    scheduled_s: float | None,
    first_token_s: float | None,
    finish_s: float | None,
) -> None:
    """Each recorded time is a number >= 0 and they never run backwards."""
    named = [
        ("scheduled_s", check_optional_float("scheduled_s", scheduled_s, 0.0)),
        ("first_token_s", check_optional_float("first_token_s", first_token_s, 0.0)),
        ("finish_s", check_optional_float("finish_s", finish_s, 0.0)),
    ]
    earlier_name, earlier = "arrival_s", arrival_s
    for name, value in named:
        if value is None:
            continue
        if value < earlier:
            raise FieldError(f"{name} ({value:g}) is before {earlier_name} ({earlier:g})")
        earlier_name, earlier = name, value


def record_from_json(obj: Mapping[str, Any]) -> ResultRecord:
    """Build a ResultRecord from one decoded JSON object; FieldError on any bad field."""
    if "request_id" not in obj and "finish_s" not in obj:
        raise FieldError(
            "no request_id or finish_s: this looks like a trace, not per-request results "
            "(results come from `tokenfair simulate --out FILE`)"
        )
    arrival_s = check_float("arrival_s", require(obj, "arrival_s"), 0.0)
    scheduled_s = obj.get("scheduled_s")
    first_token_s = obj.get("first_token_s")
    finish_s = obj.get("finish_s")
    check_times(arrival_s, scheduled_s, first_token_s, finish_s)
    return ResultRecord(
        request_id=check_str("request_id", require(obj, "request_id")),
        client=check_str("client", require(obj, "client")),
        arrival_s=arrival_s,
        input_tokens=check_int("input_tokens", require(obj, "input_tokens"), 1),
        output_tokens=check_int("output_tokens", require(obj, "output_tokens"), 0),
        scheduled_s=None if scheduled_s is None else float(scheduled_s),
        first_token_s=None if first_token_s is None else float(first_token_s),
        finish_s=None if finish_s is None else float(finish_s),
        status=check_str("status", obj.get("status", "finished")),
        finish_reason=check_finish_reason(obj.get("finish_reason")),
        preemptions=check_int("preemptions", obj.get("preemptions", 0), 0),
        requested_output_tokens=check_optional_int(
            "requested_output_tokens", obj.get("requested_output_tokens"), 0
        ),
        cached_tokens=check_int("cached_tokens", obj.get("cached_tokens", 0), 0),
    )


def result_from_request(request: Request, requested_output_tokens: int | None) -> ResultRecord:
    """The record of a request that went through the engine (finished or not)."""
    return ResultRecord(
        request_id=request.request_id,
        client=request.client,
        arrival_s=request.arrival_s,
        input_tokens=request.input_tokens,
        output_tokens=request.num_output_tokens,
        scheduled_s=request.scheduled_s,
        first_token_s=request.first_token_s,
        finish_s=request.finish_s,
        status=request.status.value,
        finish_reason=request.finish_reason.value if request.finish_reason else None,
        preemptions=request.preemptions,
        requested_output_tokens=requested_output_tokens,
        cached_tokens=request.cached_tokens,
    )


def parse_result_lines(lines: Iterable[str], source: str = "<results>") -> list[ResultRecord]:
    """Parse result lines in file order; request ids must be unique."""
    return parse_records(lines, source, ResultError, lambda obj, number: record_from_json(obj))


def read_results(path: str | Path) -> list[ResultRecord]:
    """Read a result file in file order. Raises ResultError on a bad line."""
    return parse_result_lines(read_lines(path), source=str(path))


def write_results(records: Iterable[ResultRecord], path: str | Path) -> None:
    """Write result records one per line (all fields, nulls included)."""
    write_objects((record.to_json() for record in records), path)
