"""Result files: round trip, validation, line-numbered errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenfair.results import (
    ResultError,
    ResultRecord,
    parse_result_lines,
    read_results,
    write_results,
)


def obj(**fields: object) -> str:
    base: dict[str, object] = {
        "request_id": "r0",
        "client": "a",
        "arrival_s": 1.0,
        "input_tokens": 10,
        "output_tokens": 20,
        "scheduled_s": 1.5,
        "first_token_s": 2.0,
        "finish_s": 4.0,
        "status": "finished",
        "finish_reason": "stop",
        "preemptions": 0,
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def test_round_trip(tmp_path: Path) -> None:
    records = [
        ResultRecord("r0", "a", 0.0, 10, 20, 0.1, 0.2, 1.0, "finished", "stop", 0),
        ResultRecord("r1", "b", 0.5, 5, 0, None, None, 0.5, "finished", "rejected", 0),
        ResultRecord("r2", "b", 0.7, 5, 3, 0.8, 0.9, 1.2, "finished", "abort", 2),
        ResultRecord("r3", "a", 0.9, 5, 0, None, None, None, "waiting", None, 0),
    ]
    path = tmp_path / "out" / "results.jsonl"
    write_results(records, path)
    assert read_results(path) == records
    assert json.loads(path.read_text().splitlines()[1])["first_token_s"] is None


def test_served_and_ttft() -> None:
    done = ResultRecord("r0", "a", 1.0, 10, 20, 1.5, 2.25, 4.0, "finished", "stop")
    assert done.served
    assert done.ttft_s == pytest.approx(1.25)
    rejected = ResultRecord("r1", "a", 1.0, 10, 0, None, None, 1.0, "finished", "rejected")
    assert not rejected.served
    assert rejected.ttft_s is None


def test_optional_fields_default() -> None:
    line = json.dumps(
        {"request_id": "x", "client": "c", "arrival_s": 0, "input_tokens": 1, "output_tokens": 1}
    )
    [rec] = parse_result_lines([line])
    assert rec.status == "finished"
    assert rec.finish_s is None
    assert rec.finish_reason is None
    assert rec.preemptions == 0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("nope", "invalid JSON"),
        (obj(request_id=...), "missing required field 'request_id'"),
        (obj(client=""), "client must be a non-empty string"),
        (obj(output_tokens=-1), "output_tokens must be an integer >= 0, got -1"),
        (obj(input_tokens=0), "input_tokens must be an integer >= 1, got 0"),
        (obj(finish_s="late"), 'finish_s must be a finite number >= 0 or null, got "late"'),
        (obj(finish_reason="done"), 'finish_reason must be one of "stop"'),
        (obj(preemptions=True), "preemptions must be an integer >= 0, got true"),
        (obj(first_token_s=0.5), "first_token_s (0.5) is before scheduled_s (1.5)"),
        (obj(finish_s=1.9), "finish_s (1.9) is before first_token_s (2)"),
        (obj(scheduled_s=0.5), "scheduled_s (0.5) is before arrival_s (1)"),
    ],
)
def test_bad_line_names_line(text: str, fragment: str) -> None:
    with pytest.raises(ResultError) as info:
        parse_result_lines(["", obj(request_id="ok"), text], source="results.jsonl")
    assert info.value.line == 3
    assert str(info.value).startswith("results.jsonl:3: ")
    assert fragment in str(info.value)


def test_duplicate_id() -> None:
    with pytest.raises(ResultError, match="<results>:2: duplicate request_id 'r0'"):
        parse_result_lines([obj(), obj()])


def test_construction_validates() -> None:
    with pytest.raises(ValueError, match="finish_s"):
        ResultRecord("r", "a", 5.0, 1, 1, None, None, 4.0)
