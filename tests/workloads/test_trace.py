"""Trace file reading and writing: every bad line is reported with its line number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenfair.workloads.trace import (
    TraceError,
    TraceRecord,
    parse_trace_lines,
    read_trace,
    write_trace,
)

GOOD = '{"arrival_s": 0.5, "client": "a", "input_tokens": 10, "output_tokens": 20}'


def line(**fields: object) -> str:
    base: dict[str, object] = {
        "arrival_s": 1.0,
        "client": "a",
        "input_tokens": 10,
        "output_tokens": 20,
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def test_reads_required_fields_and_defaults() -> None:
    [rec] = parse_trace_lines([GOOD])
    assert rec == TraceRecord(0.5, "a", 10, 20, "r0")
    assert rec.priority == 0
    assert rec.cancel_after_s is None
    assert rec.max_tokens is None
    assert rec.length_limit == 20


def test_default_ids_use_line_index_and_blank_lines_are_skipped() -> None:
    records = parse_trace_lines([GOOD, "", "   \n", line(arrival_s=2.0)])
    assert [r.request_id for r in records] == ["r0", "r3"]


def test_optional_fields() -> None:
    [rec] = parse_trace_lines(
        [line(request_id="x", priority=-2, cancel_after_s=3.5, max_tokens=64, extra="ok")]
    )
    assert rec.request_id == "x"
    assert rec.priority == -2
    assert rec.cancel_after_s == 3.5
    assert rec.max_tokens == 64
    assert rec.length_limit == 64


def test_null_cancel_after_is_none() -> None:
    [rec] = parse_trace_lines([line(cancel_after_s=None)])
    assert rec.cancel_after_s is None


def test_sorted_by_arrival_stably() -> None:
    records = parse_trace_lines(
        [
            line(arrival_s=2.0, request_id="late"),
            line(arrival_s=1.0, request_id="first"),
            line(arrival_s=1.0, request_id="second"),
        ]
    )
    assert [r.request_id for r in records] == ["first", "second", "late"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (line(arrival_s=...), "missing required field 'arrival_s'"),
        (line(client=...), "missing required field 'client'"),
        (line(arrival_s=-1), "arrival_s must be a finite number >= 0, got -1"),
        (line(arrival_s="1"), 'arrival_s must be a finite number >= 0, got "1"'),
        (line(arrival_s=True), "arrival_s must be a finite number >= 0, got true"),
        ('{"arrival_s": NaN, "client": "a", "input_tokens": 1, "output_tokens": 1}', "NaN"),
        (line(client=""), 'client must be a non-empty string, got ""'),
        (line(client=7), "client must be a non-empty string, got 7"),
        (line(input_tokens="abc"), 'input_tokens must be an integer >= 1, got "abc"'),
        (line(input_tokens=0), "input_tokens must be an integer >= 1, got 0"),
        (line(input_tokens=3.0), "input_tokens must be an integer >= 1, got 3.0"),
        (line(output_tokens=True), "output_tokens must be an integer >= 1, got true"),
        (line(priority=1.5), "priority must be an integer, got 1.5"),
        (line(priority=False), "priority must be an integer, got false"),
        (line(request_id=""), "request_id must be a non-empty string"),
        (line(request_id=3), "request_id must be a non-empty string, got 3"),
        (line(cancel_after_s=0), "cancel_after_s must be a finite number > 0 or null, got 0"),
        (line(cancel_after_s="x"), "cancel_after_s must be a finite number > 0 or null"),
        (line(max_tokens=19), "max_tokens must be an integer >= 20, got 19"),
        (line(max_tokens="64"), 'max_tokens must be an integer >= 20, got "64"'),
        (line(prefix_group="sys"), "prefix_group needs prefix_tokens too"),
        (line(prefix_tokens=4), "prefix_tokens needs prefix_group too"),
        (line(prefix_group="", prefix_tokens=4), "prefix_group must be a non-empty string"),
        (line(prefix_group=3, prefix_tokens=4), "prefix_group must be a non-empty string, got 3"),
        (line(prefix_group="s", prefix_tokens=0), "prefix_tokens must be an integer >= 1, got 0"),
        (line(prefix_group="s", prefix_tokens=2.0), "prefix_tokens must be an integer >= 1"),
        (line(prefix_group="s", prefix_tokens=11), "prefix_tokens must be <= input_tokens (10)"),
    ],
)
def test_bad_line_names_file_line_and_problem(text: str, fragment: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace_lines([GOOD, "", text], source="trace.jsonl")
    err = info.value
    assert err.path == "trace.jsonl"
    assert err.line == 3
    assert str(err).startswith("trace.jsonl:3: ")
    assert fragment in str(err)


def test_error_message_format_matches_docs() -> None:
    with pytest.raises(TraceError) as info:
        parse_trace_lines([GOOD] * 16 + [line(input_tokens="abc")], source="trace.jsonl")
    assert str(info.value) == 'trace.jsonl:17: input_tokens must be an integer >= 1, got "abc"'
    assert isinstance(info.value, ValueError)


def test_duplicate_request_id_is_an_error() -> None:
    with pytest.raises(
        TraceError, match=r"<trace>:2: duplicate request_id 'x' \(first used on line 1\)"
    ):
        parse_trace_lines([line(request_id="x"), line(request_id="x")])


def test_explicit_id_colliding_with_default_id_is_an_error() -> None:
    with pytest.raises(TraceError, match="duplicate request_id 'r0'"):
        parse_trace_lines([GOOD, line(request_id="r0")])


def test_record_construction_validates() -> None:
    with pytest.raises(ValueError, match="input_tokens"):
        TraceRecord(0.0, "a", 0, 1, "r")
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 5"):
        TraceRecord(0.0, "a", 1, 5, "r", max_tokens=4)


def test_round_trip_omits_defaults(tmp_path: Path) -> None:
    records = [
        TraceRecord(0.0, "a", 1, 2, "r0"),
        TraceRecord(0.25, "b", 3, 4, "id-b", priority=2, cancel_after_s=1.5, max_tokens=8),
        TraceRecord(0.5, "a", 5, 6, "r2", max_tokens=6),
    ]
    path = tmp_path / "sub" / "t.jsonl"
    write_trace(records, path)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {
        "arrival_s": 0.0,
        "client": "a",
        "input_tokens": 1,
        "output_tokens": 2,
        "request_id": "r0",
    }
    assert "max_tokens" not in json.loads(lines[2])  # equal to output_tokens: a default
    back = read_trace(path)
    assert back[:2] == records[:2]
    assert back[2] == TraceRecord(0.5, "a", 5, 6, "r2")
    assert back[2].length_limit == records[2].length_limit


def test_prefix_fields_are_read_and_written_together(tmp_path: Path) -> None:
    records = parse_trace_lines(
        [line(prefix_group="a/system", prefix_tokens=10), line(arrival_s=2.0)]
    )
    assert (records[0].prefix_group, records[0].prefix_tokens) == ("a/system", 10)
    assert (records[1].prefix_group, records[1].prefix_tokens) == (None, None)
    path = tmp_path / "t.jsonl"
    write_trace(records, path)
    written = [json.loads(text) for text in path.read_text().splitlines()]
    assert written[0]["prefix_group"] == "a/system" and written[0]["prefix_tokens"] == 10
    assert "prefix_group" not in written[1] and "prefix_tokens" not in written[1]
    assert read_trace(path) == records


def test_read_trace_reports_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n" + "oops\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert info.value.path == str(path)
    assert info.value.line == 2


def test_reads_the_shared_arena_trace() -> None:
    path = Path("/work/shared/traces/arena_vtc_600s.jsonl")
    if not path.exists():
        pytest.skip("shared trace not present")
    records = read_trace(path)
    assert len(records) == 1500
    assert len({r.client for r in records}) == 27
