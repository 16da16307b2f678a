"""Defaults that make a difference visible: every preset-dependent default in --help, the
settings used in the output, warnings that say what was rejected and why."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tokenfair import __version__
from tokenfair.cli import app

runner = CliRunner()


def write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def crowd(tmp_path: Path, count: int = 12, prompt: int = 40, output: int = 120) -> Path:
    rows = [
        {
            "arrival_s": 0.01 * i,
            "client": f"c{i % 3}",
            "input_tokens": prompt,
            "output_tokens": output,
        }
        for i in range(count)
    ]
    return write_trace(tmp_path / "crowd.jsonl", rows)


def run(args: list[str]) -> tuple[dict, str]:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"tokenfair {__version__}"


def test_help_prints_brackets_and_no_type_noise_on_flags() -> None:
    generate = runner.invoke(app, ["generate", "--help"]).stdout
    assert "(needs the [model] extra)" in " ".join(generate.split())
    metrics = runner.invoke(app, ["metrics", "--help"]).stdout
    assert "--full / --no-full" in metrics and "<bool>" not in metrics


def test_no_help_text_shows_type_noise_on_flags() -> None:
    commands = [
        [],
        ["simulate"],
        ["metrics"],
        ["generate"],
        ["profile"],
        ["demo"],
        ["trace", "gen"],
    ]
    commands += [["trace", "convert"], ["experiment", "paper"], ["experiment", "compare"]]
    for command in commands:
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, command
        assert "<bool>" not in result.stdout and "Traceback" not in result.stdout, command


def test_simulate_help_shows_each_presets_defaults() -> None:
    text = " ".join(runner.invoke(app, ["simulate", "--help"]).stdout.split())
    for fragment in (
        "paper: 10,000; engine: required",
        "paper: reserve; engine: optimistic",
        "paper: 1000; engine: 256",
        "paper: max(pool / 6, 3072); engine: 8192",
        "with --preemption swap: the pool's size",
    ):
        assert fragment in text, fragment


def test_summary_says_which_settings_ran(tmp_path: Path) -> None:
    summary, _ = run(["simulate", "--trace", str(crowd(tmp_path))])
    assert summary["preset"] == "paper" and summary["profile"] == "a10g-llama-7b"
    assert summary["config"]["kv_tokens"] == 10_000 and summary["config"]["admission"] == "reserve"


def test_swap_without_a_size_gets_an_area_and_swaps(tmp_path: Path) -> None:
    trace = crowd(tmp_path)
    common = ["simulate", "--trace", str(trace), "--preset", "engine", "--kv-tokens", "640"]
    recompute, _ = run([*common, "--preemption", "recompute"])
    swap, _ = run([*common, "--preemption", "swap"])
    assert recompute["preemptions"] > 0 and recompute["swaps"] == 0
    assert swap["config"]["swap_tokens"] == 640
    assert swap["swaps"] > 0


def test_requests_that_can_never_fit_are_reported(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": float(i), "client": "a", "input_tokens": 30, "output_tokens": 10}
        for i in range(8)
    ]
    rows += [{"arrival_s": 0.5, "client": "b", "input_tokens": 20_000, "output_tokens": 10}]
    rows += [
        {
            "arrival_s": 0.7,
            "client": "b",
            "input_tokens": 5,
            "output_tokens": 10,
            "max_tokens": 10**9,
        }
    ]
    trace = write_trace(tmp_path / "big.jsonl", rows)
    summary, stderr = run(["simulate", "--trace", str(trace)])
    assert summary["rejected"] == 2
    assert "2 of 10 requests rejected: 2 can never fit in the 10,000-token KV pool" in stderr
    assert "1,000,000,005 tokens" in stderr and "--kv-tokens" in stderr


def test_rate_limit_rejections_are_told_apart(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": 0.1 * i, "client": "a", "input_tokens": 30, "output_tokens": 5}
        for i in range(6)
    ]
    summary, stderr = run(
        ["simulate", "--trace", str(write_trace(tmp_path / "t.jsonl", rows)), "--policy", "rpm:2"]
    )
    assert summary["rejected"] == 4
    assert "4 of 6 requests rejected: 4 refused by the policy (rate limit)" in stderr


def test_results_keep_the_requested_output_length(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": 0.0, "client": "a", "input_tokens": 30, "output_tokens": 400},
        {
            "arrival_s": 0.0,
            "client": "b",
            "input_tokens": 30,
            "output_tokens": 400,
            "cancel_after_s": 1.0,
        },
    ]
    out = tmp_path / "r.jsonl"
    run(["simulate", "--trace", str(write_trace(tmp_path / "t.jsonl", rows)), "--out", str(out)])
    a, b = (json.loads(line) for line in out.read_text().splitlines())
    assert a["requested_output_tokens"] == a["output_tokens"] == 400
    assert b["requested_output_tokens"] == 400 and 0 < b["output_tokens"] < 400
    assert b["finish_reason"] == "abort"


def test_weights_that_cannot_matter_are_warned_about(tmp_path: Path) -> None:
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps({"c0": 2, "c1": 1, "ghost": 5}))
    trace = crowd(tmp_path)
    _, stderr = run(
        ["simulate", "--trace", str(trace), "--policy", "wvtc", "--weights", str(weights)]
    )
    assert "--weights names 1 client(s) absent from the trace: ghost" in stderr
    _, stderr = run(
        ["simulate", "--trace", str(trace), "--policy", "fcfs", "--weights", str(weights)]
    )
    assert "--weights has no effect on fcfs" in stderr


def test_metrics_takes_the_duration_from_the_data_and_says_so(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": 2.0 * i, "client": f"c{i % 2}", "input_tokens": 30, "output_tokens": 20}
        for i in range(60)
    ]
    out = tmp_path / "r.jsonl"
    run(["simulate", "--trace", str(write_trace(tmp_path / "t.jsonl", rows)), "--out", str(out)])
    report, stderr = _metrics([str(out), "--warmup", "10", "--window", "20"])
    assert report["params"]["duration_s"] == 118.0 and report["params"]["duration_from_data"]
    assert "T = 118 s (the last arrival, rounded down" in stderr
    given, stderr = _metrics([str(out), "--duration", "100", "--warmup", "10", "--window", "20"])
    assert given["params"]["duration_s"] == 100.0 and "(--duration)" in stderr
    assert given["max_diff"] != report["max_diff"] or given["ticks"] != report["ticks"]


def _metrics(args: list[str]) -> tuple[dict, str]:
    result = runner.invoke(app, ["metrics", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr
