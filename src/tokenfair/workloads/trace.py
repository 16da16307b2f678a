"""Trace files: the requests a replay submits, one JSON object a line.

Format (JSONL, UTF-8):

- required: `arrival_s` (number >= 0, seconds from the trace start), `client` (non-empty
  string), `input_tokens` (integer >= 1), `output_tokens` (integer >= 1: the length the
  model generates before it stops by itself);
- optional: `request_id` (non-empty string; default `"r<i>"` where i is the 0-based line
  index in the file), `priority` (integer, default 0, lower runs first),
  `cancel_after_s` (number > 0 or null: the client gives up that long after arrival),
  `max_tokens` (integer >= output_tokens; default output_tokens: the request's length
  limit, so a smaller `output_tokens` means the request stops on its own first);
- optional, together: `prefix_group` (non-empty string) and `prefix_tokens` (integer,
  1 <= prefix_tokens <= input_tokens): the prompt's first `prefix_tokens` tokens are the
  first tokens of the group's text, so two requests of one group share the first
  min(prefix_tokens) tokens of their prompts exactly (a system prompt, a document, the
  conversation so far). A request whose whole prompt lies on the group's text
  (prefix_tokens = input_tokens, a chat turn) continues that text with its output, as an
  answer becomes part of the next turn's prompt. Requests without a group share nothing.
  Groups are not scoped by client: two clients naming one group share it (the generators
  and converters never do; see docs/simulator.md).

Blank lines are skipped; unknown fields are ignored (so result or reference files that
add columns still read as traces). Every other problem raises `TraceError` naming the
file and line: nothing is silently dropped. Request ids must be unique.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenfair.workloads.jsonl import (
    FieldError,
    JsonlLineError,
    check_float,
    check_int,
    check_optional_float,
    check_str,
    parse_records,
    read_lines,
    require,
    show,
    write_objects,
)


class TraceError(JsonlLineError):
    """A trace line is invalid: str() reads like `trace.jsonl:17: input_tokens must ...`."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a workload. Construction validates every field (ValueError)."""

    arrival_s: float
    client: str
    input_tokens: int
    output_tokens: int
    request_id: str
    priority: int = 0
    cancel_after_s: float | None = None
    max_tokens: int | None = None  # None means "same as output_tokens"
    prefix_group: str | None = None
    prefix_tokens: int | None = None

    def __post_init__(self) -> None:
        check_float("arrival_s", self.arrival_s, 0.0)
        check_str("client", self.client)
        check_int("input_tokens", self.input_tokens, 1)
        check_int("output_tokens", self.output_tokens, 1)
        check_str("request_id", self.request_id)
        check_int("priority", self.priority)
        check_optional_float("cancel_after_s", self.cancel_after_s, 0.0, strict=True)
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, self.output_tokens)
        check_prefix(self.prefix_group, self.prefix_tokens, self.input_tokens)

    @property
    def length_limit(self) -> int:
        """The request's max_tokens, defaulting to its output length."""
        return self.output_tokens if self.max_tokens is None else self.max_tokens

    def to_json(self) -> dict[str, Any]:
        """The JSON object for this record, optional fields omitted at their defaults."""
        obj: dict[str, Any] = {
            "arrival_s": self.arrival_s,
            "client": self.client,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "request_id": self.request_id,
        }
        if self.priority != 0:
            obj["priority"] = self.priority
        if self.cancel_after_s is not None:
            obj["cancel_after_s"] = self.cancel_after_s
        if self.max_tokens is not None and self.max_tokens != self.output_tokens:
            obj["max_tokens"] = self.max_tokens
        if self.prefix_group is not None:
            obj["prefix_group"] = self.prefix_group
            obj["prefix_tokens"] = self.prefix_tokens
        return obj


def check_prefix(group: Any, tokens: Any, input_tokens: int) -> tuple[str | None, int | None]:
    """`prefix_group` and `prefix_tokens`: both absent, or a group and 1..input_tokens."""
    if group is None and tokens is None:
        return None, None
    if tokens is None:
        raise FieldError("prefix_group needs prefix_tokens too: how long the shared prefix is")
    if group is None:
        raise FieldError("prefix_tokens needs prefix_group too: whose prefix it shares")
    check_str("prefix_group", group)
    check_int("prefix_tokens", tokens, 1)
    if tokens > input_tokens:
        raise FieldError(
            f"prefix_tokens must be <= input_tokens ({input_tokens}): the shared prefix is "
            f"part of the prompt, got {show(tokens)}"
        )
    return group, tokens


def record_from_json(obj: Mapping[str, Any], default_id: str) -> TraceRecord:
    """Build a TraceRecord from one decoded JSON object; FieldError on any bad field."""
    arrival_s = check_float("arrival_s", require(obj, "arrival_s"), 0.0)
    client = check_str("client", require(obj, "client"))
    input_tokens = check_int("input_tokens", require(obj, "input_tokens"), 1)
    output_tokens = check_int("output_tokens", require(obj, "output_tokens"), 1)
    request_id = check_str("request_id", obj.get("request_id", default_id))
    priority = check_int("priority", obj.get("priority", 0))
    cancel_after_s = check_optional_float(
        "cancel_after_s", obj.get("cancel_after_s"), 0.0, strict=True
    )
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None:
        max_tokens = check_int("max_tokens", max_tokens, output_tokens)
    prefix_group, prefix_tokens = check_prefix(
        obj.get("prefix_group"), obj.get("prefix_tokens"), input_tokens
    )
    return TraceRecord(
        arrival_s=arrival_s,
        client=client,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_id=request_id,
        priority=priority,
        cancel_after_s=cancel_after_s,
        max_tokens=max_tokens,
        prefix_group=prefix_group,
        prefix_tokens=prefix_tokens,
    )


def parse_trace_lines(lines: Iterable[str], source: str = "<trace>") -> list[TraceRecord]:
    """Parse trace lines into records sorted by arrival (stable for equal arrivals)."""
    records = parse_records(
        lines, source, TraceError, lambda obj, number: record_from_json(obj, f"r{number - 1}")
    )
    records.sort(key=lambda r: r.arrival_s)
    return records


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Read a trace file; records sorted by arrival_s (stable). Raises TraceError."""
    return parse_trace_lines(read_lines(path), source=str(path))


def write_trace(records: Iterable[TraceRecord], path: str | Path) -> None:
    """Write records as a trace file, one per line, in the order given."""
    write_objects((record.to_json() for record in records), path)
