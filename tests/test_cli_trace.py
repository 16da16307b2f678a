"""`tokenfair trace gen` and `tokenfair trace convert`."""

from __future__ import annotations

import itertools
import json

from typer.testing import CliRunner

from tokenfair.cli import app
from tokenfair.workloads.trace import read_trace

runner = CliRunner()


def test_trace_gen_writes_a_readable_suite(tmp_path):
    out = tmp_path / "overload.jsonl"
    result = runner.invoke(app, ["trace", "gen", "overload", "--out", str(out), "--seed", "3"])
    assert result.exit_code == 0, result.output
    records = read_trace(out)
    assert json.loads(result.stdout)["requests"] == len(records) > 1000
    assert {r.client for r in records} == {"client-0", "client-1"}


def test_trace_gen_weighted_suite_writes_weights(tmp_path):
    out, weights = tmp_path / "w.jsonl", tmp_path / "weights.json"
    result = runner.invoke(
        app, ["trace", "gen", "overload-weighted", "--out", str(out), "--weights-out", str(weights)]
    )
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(weights.read_text()).values()) == [1, 2, 3, 4]


def test_trace_gen_unknown_suite_lists_the_known_ones(tmp_path):
    result = runner.invoke(app, ["trace", "gen", "nope", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "overload" in result.output


def test_trace_convert_azure_with_hashed_clients(tmp_path):
    source = tmp_path / "azure.csv"
    source.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.1000000,879,20\n"
    )
    out = tmp_path / "t.jsonl"
    result = runner.invoke(
        app,
        [
            "trace",
            "convert",
            "azure",
            str(source),
            "--out",
            str(out),
            "--client",
            "hash:ContextTokens:2",
        ],
    )
    assert result.exit_code == 0, result.output
    records = read_trace(out)
    assert [r.input_tokens for r in records] == [374, 396, 879]
    assert records[0].arrival_s == 0.0 and abs(records[1].arrival_s - 4.314579) < 1e-3
    assert {r.client for r in records} <= {"client-0", "client-1"}


def test_trace_convert_names_the_bad_row(tmp_path):
    source = tmp_path / "azure.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,5\n2.0,ten,5\n")
    result = runner.invoke(
        app, ["trace", "convert", "azure", str(source), "--out", str(tmp_path / "o.jsonl")]
    )
    assert result.exit_code == 2
    assert "azure.csv:3" in result.output


def test_trace_gen_prefix_suites_fill_the_prefix_fields(tmp_path):
    for suite in ("system-prompt", "multiturn"):
        out = tmp_path / f"{suite}.jsonl"
        result = runner.invoke(app, ["trace", "gen", suite, "--out", str(out)])
        assert result.exit_code == 0, result.output
        records = read_trace(out)
        assert all(r.prefix_group and r.prefix_group.startswith(r.client + "/") for r in records)
    turns: dict[str, list] = {}
    for r in read_trace(tmp_path / "multiturn.jsonl"):
        turns.setdefault(r.prefix_group, []).append(r)
    conversation = max(turns.values(), key=len)
    # Each turn's prompt is the previous prompt, its answer and a new message.
    for before, after in itertools.pairwise(conversation):
        assert after.input_tokens > before.input_tokens + before.output_tokens
        assert after.arrival_s > before.arrival_s


def test_trace_convert_sharegpt_multiturn(tmp_path):
    source = tmp_path / "sg.json"
    conversations = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": "hello " * 10},
                {"from": "gpt", "value": "hi " * 20},
                {"from": "human", "value": "more " * 4},
                {"from": "gpt", "value": "sure " * 8},
            ],
        }
        for i in range(3)
    ]
    source.write_text(json.dumps(conversations))
    out = tmp_path / "t.jsonl"
    result = runner.invoke(
        app, ["trace", "convert", "sharegpt", str(source), "--out", str(out), "--multiturn"]
    )
    assert result.exit_code == 0, result.output
    records = read_trace(out)
    assert len(records) == 6 and len({r.prefix_group for r in records}) == 3
    refused = runner.invoke(
        app, ["trace", "convert", "azure", str(source), "--out", str(out), "--multiturn"]
    )
    assert refused.exit_code == 2 and "--multiturn is for sharegpt" in refused.output


def test_trace_help_has_examples():
    for command in (["trace", "gen", "--help"], ["trace", "convert", "--help"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 0 and "Example" in result.stdout


def test_trace_gen_documents_takes_its_options(tmp_path):
    out = tmp_path / "docs.jsonl"
    args = ["trace", "gen", "documents", "--out", str(out), "--clients", "3"]
    args += ["--documents-per-client", "2", "--document-tokens", "800", "--skew", "1.5"]
    args += ["--shared-documents", "1", "--question-tokens", "20-30", "--output-tokens", "64"]
    args += ["--rate", "0.2", "--busy-factor", "1", "--duration", "120", "--seed", "4"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    records = read_trace(out)
    assert {r.client for r in records} == {"client-0", "client-1", "client-2"}
    assert {r.prefix_group for r in records} <= {
        "shared/doc-0",
        *(f"client-{i}/doc-0" for i in range(3)),
    }
    assert all(r.prefix_tokens == 800 and 20 <= r.input_tokens - 800 <= 30 for r in records)
    assert {r.output_tokens for r in records} == {64}
    assert max(r.arrival_s for r in records) < 120
    again = tmp_path / "again.jsonl"
    assert runner.invoke(app, [*args[:4], str(again), *args[5:]]).exit_code == 0
    assert read_trace(again) == records


def test_trace_gen_documents_refuses_bad_options_naming_them(tmp_path):
    out = str(tmp_path / "d.jsonl")
    cases = [
        (["--shared-documents", "5"], "--shared-documents must be at most --documents-per-client"),
        (["--question-tokens", "150-50"], "--question-tokens: expected N or LOW-HIGH"),
        (["--output-tokens", "lots"], "--output-tokens: expected N or LOW-HIGH"),
        (["--skew", "-1"], "--skew must be a finite number >= 0"),
        (["--rate", "0"], "--rate must be a finite number > 0"),
        (["--clients", "0"], "--clients must be a whole number >= 1"),
        (["--duration", "nan"], "--duration must be a finite number > 0"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, ["trace", "gen", "documents", "--out", out, *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)
    # The documents options belong to the documents workload only.
    result = runner.invoke(app, ["trace", "gen", "overload", "--out", out, "--skew", "1"])
    assert result.exit_code == 2
    assert "--skew is an option of the documents workload" in result.output
    assert not (tmp_path / "d.jsonl").exists()
