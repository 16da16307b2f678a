"""Whatever a file holds, reading it gives records or one ValueError naming the place:
never another exception (which the command line would show as a traceback)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfair.core.policies import make_policy
from tokenfair.results import parse_result_lines
from tokenfair.workloads.trace import parse_trace_lines

FIELDS = [
    "arrival_s",
    "client",
    "input_tokens",
    "output_tokens",
    "request_id",
    "priority",
    "max_tokens",
    "cancel_after_s",
    "scheduled_s",
    "first_token_s",
    "finish_s",
    "status",
    "finish_reason",
    "preemptions",
    "requested_output_tokens",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
objects = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=len(FIELDS))
lines = st.lists(st.one_of(objects.map(json.dumps), st.text(max_size=40)), max_size=6)


@settings(max_examples=100, deadline=None)
@given(lines)
def test_trace_lines_give_records_or_a_named_error(text_lines: list[str]) -> None:
    try:
        parse_trace_lines(text_lines, source="t.jsonl")
    except ValueError as error:
        assert str(error).startswith("t.jsonl:")


@settings(max_examples=100, deadline=None)
@given(lines)
def test_result_lines_give_records_or_a_named_error(text_lines: list[str]) -> None:
    try:
        parse_result_lines(text_lines, source="r.jsonl")
    except ValueError as error:
        assert str(error).startswith("r.jsonl:")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=20))
def test_any_policy_name_builds_or_says_what_to_fix(spec: str) -> None:
    try:
        make_policy(spec, weights={"a": 1.0})
    except ValueError as error:
        assert str(error)
