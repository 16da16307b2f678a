"""The `tokenfair` command, driven in-process as a user would type it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tokenfair.cli import app

runner = CliRunner()

RESULT_FIELDS = {
    "cached_tokens",
    "request_id",
    "client",
    "arrival_s",
    "input_tokens",
    "output_tokens",
    "scheduled_s",
    "first_token_s",
    "finish_s",
    "requested_output_tokens",
    "status",
    "finish_reason",
    "preemptions",
}


def write_trace(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def small_trace(tmp_path):
    return write_trace(
        tmp_path / "t.jsonl",
        [
            json.dumps(
                {
                    "arrival_s": i * 0.5,
                    "client": f"c{i % 3}",
                    "input_tokens": 20 + i,
                    "output_tokens": 30,
                }
            )
            for i in range(30)
        ],
    )


def test_simulate_writes_one_result_per_request(tmp_path):
    out = tmp_path / "r.jsonl"
    result = runner.invoke(
        app,
        ["simulate", "--trace", str(small_trace(tmp_path)), "--policy", "vtc", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["requests"] == 30 and summary["served"] == 30
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 30
    assert set(rows[0]) == RESULT_FIELDS
    assert all(r["output_tokens"] == 30 and r["finish_reason"] == "stop" for r in rows)
    assert all(r["requested_output_tokens"] == 30 for r in rows)
    assert all(
        r["arrival_s"] <= r["scheduled_s"] <= r["first_token_s"] <= r["finish_s"] for r in rows
    )


def test_simulate_engine_preset_with_options(tmp_path):
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(small_trace(tmp_path)),
            "--policy",
            "fcfs",
            "--preset",
            "engine",
            "--kv-tokens",
            "512",
            "--preemption",
            "swap",
            "--swap-tokens",
            "256",
            "--admission",
            "optimistic",
            "--profile",
            "h200-llama-3-8b",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["served"] == 30


def test_simulate_caches_shared_prefixes_on_the_engine_preset_only(tmp_path):
    trace = tmp_path / "shared.jsonl"
    runner.invoke(app, ["trace", "gen", "system-prompt", "--out", str(trace)])
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(trace.read_text().splitlines()[:200]) + "\n")

    def summary(*options: str) -> dict:
        result = runner.invoke(app, ["simulate", "--trace", str(short), *options])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.strip().splitlines()[-1])

    engine = ["--preset", "engine", "--kv-tokens", "8192"]
    cached = summary(*engine, "--policy", "dlpm")
    assert cached["config"]["enable_prefix_caching"] and cached["prefix_hit_rate"] > 0.5
    uncached = summary(*engine, "--no-prefix-caching")
    assert uncached["prefix_hit_rate"] is None
    assert uncached["throughput_tok_s"] < cached["throughput_tok_s"]
    assert summary()["prefix_hit_rate"] is None  # the paper's system had no prefix cache
    assert summary("--prefix-caching")["prefix_hit_rate"] > 0.5
    result = runner.invoke(app, ["simulate", "--trace", str(short), "--charge-cached-tokens", "2"])
    assert result.exit_code == 2 and "--charge-cached-tokens" in result.output


def test_bad_trace_line_is_named_and_nothing_runs(tmp_path):
    trace = write_trace(
        tmp_path / "bad.jsonl",
        [
            '{"arrival_s": 0, "client": "a", "input_tokens": 5, "output_tokens": 5}',
            "",
            '{"arrival_s": 1, "client": "a", "input_tokens": "many", "output_tokens": 5}',
        ],
    )
    out = tmp_path / "r.jsonl"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--out", str(out)])
    assert result.exit_code == 2
    assert "bad.jsonl:3" in result.output and "input_tokens" in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "nope"], "unknown policy"),
        (["--policy", "wvtc"], "weights"),
        (["--profile", "tpu-v9"], "unknown profile"),
        (["--admission", "lazy"], "admission"),
        (["--kv-tokens", "0"], "--kv-tokens"),
        (["--preset", "mystery"], "preset"),
    ],
)
def test_bad_options_get_clear_errors(tmp_path, args, message):
    result = runner.invoke(app, ["simulate", "--trace", str(small_trace(tmp_path)), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_weights_file_is_checked(tmp_path):
    weights = tmp_path / "w.json"
    weights.write_text('{"c0": 0}')
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(small_trace(tmp_path)),
            "--policy",
            "wvtc",
            "--weights",
            str(weights),
        ],
    )
    assert result.exit_code == 2 and "'c0'" in result.output
    weights.write_text('{"c0": 1, "c1": 2, "c2": 4}')
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(small_trace(tmp_path)),
            "--policy",
            "wvtc",
            "--weights",
            str(weights),
        ],
    )
    assert result.exit_code == 0, result.output


def test_metrics_reads_simulate_output(tmp_path):
    out = tmp_path / "r.jsonl"
    runner.invoke(app, ["simulate", "--trace", str(small_trace(tmp_path)), "--out", str(out)])
    result = runner.invoke(
        app, ["metrics", str(out), "--duration", "15", "--window", "4", "--warmup", "1"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("max_diff", "avg_diff", "diff_var", "throughput_tok_s", "clients"):
        assert key in report
    assert set(report["clients"]) == {"c0", "c1", "c2"}


def test_metrics_names_a_bad_result_line(tmp_path):
    bad = tmp_path / "r.jsonl"
    bad.write_text('{"request_id": "x"}\n')
    result = runner.invoke(app, ["metrics", str(bad)])
    assert result.exit_code == 2 and "r.jsonl:1" in result.output


@pytest.mark.parametrize(
    "command", ["simulate", "metrics", "policies", "profiles", "demo", "generate", "profile"]
)
def test_every_command_has_help_with_an_example(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.stdout


def test_policies_lists_every_policy():
    result = runner.invoke(app, ["policies"])
    for name in (
        "fcfs",
        "priority",
        "sjf",
        "rpm:N",
        "lcf",
        "vtc",
        "wvtc",
        "vtc-predict",
        "vtc-oracle",
        "vtc-preempt",
    ):
        assert name in result.stdout


@pytest.mark.model
def test_generate_with_the_builtin_model_is_deterministic_for_a_seed():
    args = [
        "generate",
        "--prompt",
        "Hello",
        "--max-tokens",
        "8",
        "--temperature",
        "0.8",
        "--seed",
        "3",
    ]
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout and first.stdout.strip()


def test_generate_names_a_missing_model_directory(tmp_path):
    result = runner.invoke(app, ["generate", "--prompt", "x", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "nope" in result.output


def test_data_lists_the_shipped_files_and_prints_a_path():
    """The shipped trace and measured run, by name; a name alone prints its path (the
    same bytes as shared/'s), for a script; an unknown name is one line naming them."""
    from pathlib import Path

    listed = runner.invoke(app, ["data"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0
    assert "arena" in listed.output and "a10g-fcfs-arena" in listed.output
    assert listed.output.count("1,500") == 2
    one = runner.invoke(app, ["data", "arena"])
    assert one.exit_code == 0
    path = Path(one.output.strip())
    assert path.name == "arena_vtc_600s.jsonl"
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / path.name
    assert path.read_bytes() == shared.read_bytes()
    wrong = runner.invoke(app, ["data", "nope"])
    assert wrong.exit_code == 2
    assert "no shipped dataset 'nope'; the shipped ones: arena, a10g-fcfs-arena" in wrong.output
