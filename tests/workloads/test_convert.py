"""Converters from public trace formats: small files written here, converted, checked."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from tokenfair.workloads.arrivals import Phases, Uniform
from tokenfair.workloads.client_map import ClientMap, parse_client_map
from tokenfair.workloads.convert import (
    ConvertError,
    convert_azure,
    convert_burstgpt,
    convert_mooncake,
    convert_sharegpt,
    estimate_tokens,
    first_arrivals,
)
from tokenfair.workloads.trace import read_trace, write_trace

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def burst(tmp_path: Path, rows: str) -> Path:
    return write(tmp_path, "burst.csv", BURST_HEADER + rows)


# --- BurstGPT ---------------------------------------------------------------------


def test_burstgpt_basic(tmp_path: Path) -> None:
    path = burst(
        tmp_path,
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,GPT-4,1087,231,1318,API log\n"
        "7,ChatGPT,100,200,300,Conversation log\n",
    )
    records = convert_burstgpt(path, ClientMap.column("Model"))
    assert [(r.arrival_s, r.client, r.input_tokens, r.output_tokens) for r in records] == [
        (0.0, "ChatGPT", 472, 18),
        (2.0, "ChatGPT", 100, 200),
        (40.0, "GPT-4", 1087, 231),
    ]
    assert [r.request_id for r in records] == ["r0", "r1", "r2"]


def test_burstgpt_filters_speedup_duration_limit(tmp_path: Path) -> None:
    path = burst(
        tmp_path,
        "".join(
            f"{t},ChatGPT,10,20,30,{'API log' if t % 2 else 'Conversation log'}\n"
            for t in range(20)
        ),
    )
    conv_only = convert_burstgpt(path, ClientMap.constant("all"), log_type="Conversation log")
    assert len(conv_only) == 10
    assert [r.arrival_s for r in conv_only[:3]] == [0.0, 2.0, 4.0]
    fast = convert_burstgpt(path, ClientMap.constant("all"), speedup=4.0, duration_s=2.0)
    assert [r.arrival_s for r in fast] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    assert len(convert_burstgpt(path, ClientMap.constant("all"), limit=3)) == 3
    assert convert_burstgpt(path, ClientMap.constant("x"), models=["GPT-4"]) == []


def test_burstgpt_zero_response_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = burst(tmp_path, "5,ChatGPT,472,18,490,Conversation log\n6,ChatGPT,472,0,472,API log\n")
    with pytest.raises(ConvertError) as info:
        convert_burstgpt(path, ClientMap.constant("c"))
    assert info.value.where == 3
    assert str(info.value).startswith(f"{path}:3: Response tokens must be an integer >= 1, got '0'")
    assert "--skip-invalid" in str(info.value)


def test_burstgpt_skip_invalid_logs_the_count(tmp_path: Path, caplog) -> None:
    path = burst(
        tmp_path,
        "5,ChatGPT,472,18,490,Conversation log\n6,ChatGPT,472,0,472,API log\n7,ChatGPT,x,1,1,API log\n8,ChatGPT,1\n",
    )
    with caplog.at_level(logging.WARNING):
        records = convert_burstgpt(path, ClientMap.constant("c"), skip_invalid=True)
    assert len(records) == 1
    assert "skipped 3 invalid rows" in caplog.text


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("abc,ChatGPT,1,1,2,API log\n", "Timestamp must be a number, got 'abc'"),
        ("1,ChatGPT,1.5,1,2,API log\n", "Request tokens must be an integer >= 1, got '1.5'"),
        ("1,ChatGPT,1,1\n", "expected 6 cells, got 4"),
        ("1,,1,1,2,API log\n", "client column 'Model' is empty"),
    ],
)
def test_burstgpt_bad_rows(tmp_path: Path, row: str, fragment: str) -> None:
    path = burst(tmp_path, "0,ChatGPT,1,1,2,API log\n" + row)
    with pytest.raises(ConvertError, match=r":3: ") as info:
        convert_burstgpt(path, ClientMap.column("Model"))
    assert fragment in str(info.value)


def test_burstgpt_accepts_integral_floats(tmp_path: Path) -> None:
    path = burst(tmp_path, "0.5,ChatGPT,12.0,7,19,API log\n")
    [rec] = convert_burstgpt(path, ClientMap.constant("c"))
    assert (rec.input_tokens, rec.output_tokens) == (12, 7)


def test_missing_column_is_reported_on_the_header(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", "Timestamp,Request tokens\n1,2\n")
    with pytest.raises(ConvertError, match=r"b.csv:1: missing column\(s\) \['Response tokens'\]"):
        convert_burstgpt(path, ClientMap.constant("c"))
    with pytest.raises(ConvertError, match="missing column"):
        convert_burstgpt(burst(tmp_path, ""), ClientMap.column("Tenant"))
    with pytest.raises(ConvertError, match="empty file"):
        convert_burstgpt(write(tmp_path, "e.csv", ""), ClientMap.constant("c"))


def test_hashed_clients_are_stable_and_bounded(tmp_path: Path) -> None:
    rows = "".join(f"{t},model-{t % 7},10,10,20,API log\n" for t in range(50))
    path = burst(tmp_path, rows)
    first = convert_burstgpt(path, ClientMap.hashed("Model", 3))
    again = convert_burstgpt(path, ClientMap.hashed("Model", 3))
    assert first == again
    assert {r.client for r in first} <= {"client-0", "client-1", "client-2"}
    # the same model always lands on the same client
    by_model: dict[int, set[str]] = {}
    for t, rec in enumerate(first):
        by_model.setdefault(t % 7, set()).add(rec.client)
    assert all(len(clients) == 1 for clients in by_model.values())


# --- Azure -----------------------------------------------------------------------


def test_azure_datetimes(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:16:47.0000000,879,5\n",
    )
    records = convert_azure(path, ClientMap.constant("azure"))
    assert [r.arrival_s for r in records] == pytest.approx([0.0, 4.314579, 60.31941])
    assert [(r.input_tokens, r.output_tokens) for r in records] == [(374, 44), (396, 109), (879, 5)]
    assert {r.client for r in records} == {"azure"}


def test_azure_numeric_timestamps_and_bad_ones(tmp_path: Path) -> None:
    ok = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n10,1,2\n12.5,3,4\n")
    assert [r.arrival_s for r in convert_azure(ok, ClientMap.constant("c"))] == [0.0, 2.5]
    bad = write(
        tmp_path, "b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n10,1,2\nyesterday,3,4\n"
    )
    with pytest.raises(ConvertError, match=r"b.csv:3: TIMESTAMP must be a date-time or seconds"):
        convert_azure(bad, ClientMap.constant("c"))


# --- Mooncake --------------------------------------------------------------------


def test_mooncake(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]},
        {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 52]},
        {"timestamp": 30000, "input_length": 100, "output_length": 3, "hash_ids": [9]},
    ]
    path = write(tmp_path, "mc.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    records = convert_mooncake(path, ClientMap.hashed("hash_ids[0]", 4))
    assert [r.arrival_s for r in records] == pytest.approx([0.0, 2.518, 3.053])
    assert records[0].client == records[2].client  # same first prefix block, same client
    by_column = convert_mooncake(path, ClientMap.column("hash_ids[0]"))
    assert [r.client for r in by_column] == ["46", "9", "46"]


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{bad", "invalid JSON"),
        ('{"timestamp": 1, "input_length": 5}', "missing field 'output_length'"),
        (
            '{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": [1]}',
            "input_length must be an integer >= 1, got 0",
        ),
        (
            '{"timestamp": 1, "input_length": 1, "output_length": 1}',
            "missing client column 'hash_ids[0]'",
        ),
        (
            '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": []}',
            "index out of range",
        ),
    ],
)
def test_mooncake_bad_lines(tmp_path: Path, line: str, fragment: str) -> None:
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}'
    path = write(tmp_path, "mc.jsonl", good + "\n\n" + line + "\n")
    with pytest.raises(ConvertError, match=r"mc.jsonl:3: ") as info:
        convert_mooncake(path, ClientMap.hashed("hash_ids[0]", 2))
    assert fragment in str(info.value)


# --- ShareGPT ---------------------------------------------------------------------


def sharegpt_data() -> list[dict]:
    return [
        {"id": "a", "model": "m1", "conversations": [
            {"from": "human", "value": "x" * 40},
            {"from": "gpt", "value": "y" * 10},
            {"from": "human", "value": "ignored follow-up"},
        ]},
        {"id": "b", "model": "m2", "conversations": [
            {"from": "system", "value": "s" * 8},
            {"from": "user", "value": "q" * 3},
            {"from": "assistant", "value": "a" * 401},
        ]},
        {"id": "c", "model": "m1", "conversations": [
            {"from": "human", "value": "hello there"},
            {"from": "gpt", "value": "general kenobi"},
        ]},
    ]  # fmt: skip


def test_sharegpt_default_token_estimate_and_uniform_arrivals(tmp_path: Path) -> None:
    path = write(tmp_path, "sg.json", json.dumps(sharegpt_data()))
    records = convert_sharegpt(path, ClientMap.column("model"), arrivals=Uniform(2.0), seed=1)
    # chars/4 rounded up: 40 -> 10, 10 -> 3; system + user joined by a newline:
    # 8 + 1 + 3 = 12 chars -> 3, 401 -> 101; "hello there" 11 -> 3, "general kenobi" 14 -> 4.
    assert [(r.client, r.input_tokens, r.output_tokens) for r in records] == [
        ("m1", 10, 3),
        ("m2", 3, 101),
        ("m1", 3, 4),
    ]
    # uniform arrivals 0.5 s apart, shifted to start at 0
    assert [r.arrival_s for r in records] == pytest.approx([0.0, 0.5, 1.0])


def test_sharegpt_tokenizer_callable_and_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "sg.json", json.dumps(sharegpt_data()))
    records = convert_sharegpt(
        path, ClientMap.constant("c"), count_tokens=lambda text: len(text.split()), limit=2
    )
    assert [(r.input_tokens, r.output_tokens) for r in records] == [(1, 1), (2, 1)]


def test_sharegpt_deterministic_poisson_arrivals(tmp_path: Path) -> None:
    path = write(tmp_path, "sg.json", json.dumps(sharegpt_data()))
    a = convert_sharegpt(path, ClientMap.hashed("id", 2), seed=5)
    b = convert_sharegpt(path, ClientMap.hashed("id", 2), seed=5)
    c = convert_sharegpt(path, ClientMap.hashed("id", 2), seed=6)
    assert a == b
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c]


@pytest.mark.parametrize(
    ("conv", "fragment"),
    [
        (
            {"id": "z", "conversations": [{"from": "human", "value": "hi"}]},
            "not followed by a model turn",
        ),
        ({"id": "z", "conversations": [{"from": "gpt", "value": "hi"}]}, "no human turn"),
        ({"id": "z"}, "missing 'conversations' list"),
        (
            {
                "id": "z",
                "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}],
            },
            "reply token count must be an integer >= 1, got 0",
        ),
        ("text", "expected a conversation object"),
    ],
)
def test_sharegpt_bad_conversations(tmp_path: Path, conv, fragment: str) -> None:
    path = write(tmp_path, "sg.json", json.dumps([sharegpt_data()[0], conv]))
    with pytest.raises(ConvertError, match=r"sg\.json:conversation 1") as info:
        convert_sharegpt(path, ClientMap.constant("c"))
    assert fragment in str(info.value)
    kept = convert_sharegpt(path, ClientMap.constant("c"), skip_invalid=True)
    assert len(kept) == 1


def test_sharegpt_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="invalid JSON"):
        convert_sharegpt(write(tmp_path, "a.json", "[{"), ClientMap.constant("c"))
    with pytest.raises(ConvertError, match="expected a JSON list"):
        convert_sharegpt(write(tmp_path, "b.json", "{}"), ClientMap.constant("c"))


# --- shared pieces ----------------------------------------------------------------


def test_estimate_tokens() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2


def test_first_arrivals() -> None:
    times = first_arrivals(Uniform(10.0), 25, seed=0)
    assert len(times) == 25
    assert np.allclose(np.diff(times), 0.1)
    with pytest.raises(ValueError, match="fewer than"):
        first_arrivals(Phases(((1.0, Uniform(1.0)),)), 5)


def test_parse_client_map() -> None:
    assert parse_client_map("column:Model") == ClientMap.column("Model")
    assert parse_client_map("hash:hash_ids[0]:8") == ClientMap.hashed("hash_ids[0]", 8)
    assert parse_client_map("hash:a:b:3") == ClientMap.hashed("a:b", 3)
    assert parse_client_map("const:everyone") == ClientMap.constant("everyone")
    assert ClientMap.hashed("Model", 8).describe() == "hash:Model:8"
    for bad in ("Model", "hash:Model", "hash:Model:0", "column:", "const:"):
        with pytest.raises(ValueError, match="bad client mapping"):
            parse_client_map(bad)


def test_converted_records_write_as_a_trace(tmp_path: Path) -> None:
    path = burst(tmp_path, "5,ChatGPT,472,18,490,Conversation log\n6,GPT-4,1,2,3,API log\n")
    records = convert_burstgpt(path, ClientMap.column("Model"))
    out = tmp_path / "trace.jsonl"
    write_trace(records, out)
    assert read_trace(out) == records


def test_mooncake_hash_ids_fill_the_prefix_fields(tmp_path: Path) -> None:
    rows = [
        # One conversation's two turns share their first two blocks; a third request
        # shares only the first; a fourth shares nothing; a fifth has no hash ids.
        {"timestamp": 0, "input_length": 900, "output_length": 5, "hash_ids": [7, 8]},
        {"timestamp": 10, "input_length": 1500, "output_length": 5, "hash_ids": [7, 8, 9]},
        {"timestamp": 20, "input_length": 700, "output_length": 5, "hash_ids": [7, 3]},
        {"timestamp": 30, "input_length": 600, "output_length": 5, "hash_ids": [5, 6]},
        {"timestamp": 40, "input_length": 600, "output_length": 5},
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows))
    records = convert_mooncake(path, ClientMap.constant("a"))
    fields = [(r.prefix_group, r.prefix_tokens) for r in records]
    assert fields == [
        ("a/mooncake-7", 900),  # shares both blocks, capped at its prompt
        ("a/mooncake-7", 1024),
        ("a/mooncake-7", 512),
        (None, None),
        (None, None),
    ]


def test_mooncake_prefixes_are_not_shared_across_clients(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1], "u": "x"},
        {"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1], "u": "y"},
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows))
    records = convert_mooncake(path, ClientMap.column("u"))
    assert [r.prefix_group for r in records] == [None, None]


def test_mooncake_bad_hash_ids_name_the_line(tmp_path: Path) -> None:
    line = {"timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": ["a"]}
    path = write(tmp_path, "m.jsonl", json.dumps(line))
    with pytest.raises(ConvertError, match=r"m.jsonl:1: hash_ids must be a list of integers"):
        convert_mooncake(path, ClientMap.constant("a"))


def test_sharegpt_multiturn_makes_one_request_per_exchange(tmp_path: Path) -> None:
    conversations = [
        {
            "id": "c1",
            "conversations": [
                {"from": "system", "value": "s" * 40},
                {"from": "human", "value": "h" * 8},
                {"from": "gpt", "value": "g" * 20},
                {"from": "human", "value": "h" * 4},
                {"from": "gpt", "value": "g" * 12},
            ],
        },
        {
            "id": "c2",
            "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}],
        },
    ]
    path = write(tmp_path, "sg.json", json.dumps(conversations))
    records = convert_sharegpt(
        path, ClientMap.constant("a"), arrivals=Uniform(0.001), multiturn=True, turn_gap_s=5.0
    )
    by_group: dict[str | None, list] = {}
    for r in records:
        by_group.setdefault(r.prefix_group, []).append(r)
    first = by_group["a/conversation-0"]
    # Turn 1: system + human = 10 + 2 tokens; turn 2: that, the reply (5) and 1 more.
    assert [(r.input_tokens, r.output_tokens) for r in first] == [(12, 5), (18, 3)]
    assert all(r.prefix_tokens == r.input_tokens for r in first)
    assert first[1].arrival_s > first[0].arrival_s
    assert [(r.input_tokens, r.output_tokens) for r in by_group["a/conversation-1"]] == [(1, 1)]
