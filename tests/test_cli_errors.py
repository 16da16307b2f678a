"""Every bad input ends in one clear line naming the file, line or option: never a
traceback, never silence. Each case runs the real command (typer's CliRunner, stdout
and stderr apart) and checks the exit status and the message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenfair.cli import app

runner = CliRunner()


def trace_file(tmp_path: Path, name: str = "t.jsonl", lines: int = 20) -> Path:
    path = tmp_path / name
    path.write_text(
        "".join(
            json.dumps(
                {
                    "arrival_s": i * 0.5,
                    "client": f"c{i % 2}",
                    "input_tokens": 40,
                    "output_tokens": 8,
                }
            )
            + "\n"
            for i in range(lines)
        )
    )
    return path


def results_file(tmp_path: Path) -> Path:
    out = tmp_path / "r.jsonl"
    ok = runner.invoke(app, ["simulate", "--trace", str(trace_file(tmp_path)), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    return out


def error_line(args: list[str], status: int = 2) -> str:
    """Run the command; it must fail with `status` and say why in one stderr line."""
    result = runner.invoke(app, args)
    assert result.exit_code == status, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "Error:"))]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_profile_json_that_is_not_a_profile(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.json"
    bogus.write_text(json.dumps({"hello": "world"}))
    line = error_line(["simulate", "--trace", str(trace_file(tmp_path)), "--profile", str(bogus)])
    assert f"--profile {bogus} is not a step-time profile" in line
    broken = tmp_path / "broken.json"
    broken.write_text("{\n  nope")
    line = error_line(["simulate", "--trace", str(trace_file(tmp_path)), "--profile", str(broken)])
    assert f"--profile {broken}:2: not JSON" in line


def test_profile_that_is_a_folder(tmp_path: Path) -> None:
    line = error_line(
        ["simulate", "--trace", str(trace_file(tmp_path)), "--profile", str(tmp_path)]
    )
    assert f"--profile {tmp_path} is a folder" in line


@pytest.mark.parametrize(
    "command",
    [
        ["simulate", "--trace", "TRACE"],
        ["trace", "gen", "overload"],
        ["profile", "--model", "builtin:tiny"],
        ["trace", "convert", "azure", "TRACE"],
    ],
)
def test_output_that_is_a_folder_is_refused_before_any_work(
    tmp_path: Path, command: list[str]
) -> None:
    trace = trace_file(tmp_path)
    args = [str(trace) if a == "TRACE" else a for a in command]
    line = error_line([*args, "--out", str(tmp_path)])
    assert f"--out {tmp_path} is a folder" in line


def test_device_this_torch_cannot_use() -> None:
    torch = pytest.importorskip("torch")
    line = error_line(["generate", "--prompt", "hi", "--device", "tpu"])
    assert "--device tpu: expected cpu, cuda or cuda:N" in line
    if not torch.cuda.is_available():
        line = error_line(["generate", "--prompt", "hi", "--device", "cuda"])
        assert "--device cuda: this torch" in line and "use --device cpu" in line


def test_binary_trace_names_the_file(tmp_path: Path) -> None:
    binary = tmp_path / "trace.jsonl.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe\x00binary")
    line = error_line(["simulate", "--trace", str(binary)])
    assert f"{binary}:1: not UTF-8 text" in line


def test_missing_trace_names_the_file(tmp_path: Path) -> None:
    line = error_line(["simulate", "--trace", str(tmp_path / "absent.jsonl")])
    assert f"{tmp_path / 'absent.jsonl'}: No such file or directory" in line


def test_invalid_trace_line_names_file_and_line(tmp_path: Path) -> None:
    path = trace_file(tmp_path)
    path.write_text(
        path.read_text()
        + '{"arrival_s": -1, "client": "c", "input_tokens": 1, "output_tokens": 1}\n'
    )
    line = error_line(["simulate", "--trace", str(path)])
    assert f"{path}:21:" in line and "arrival_s" in line


def test_fractional_rate_limit_asks_for_a_whole_number(tmp_path: Path) -> None:
    line = error_line(["simulate", "--trace", str(trace_file(tmp_path)), "--policy", "rpm:2.5"])
    assert "whole number of requests per minute" in line


@pytest.mark.parametrize(
    "command",
    [["trace", "gen", "overload", "--out", "OUT"], ["generate", "--prompt", "hi"]],
)
def test_negative_seed_names_the_option(tmp_path: Path, command: list[str]) -> None:
    args = [str(tmp_path / "o.jsonl") if a == "OUT" else a for a in command]
    line = error_line([*args, "--seed", "-1"])
    assert "'--seed'" in line


def test_convert_hint_names_the_command_line_option(tmp_path: Path) -> None:
    source = tmp_path / "azure.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,5\n2.0,ten,5\n")
    line = error_line(
        ["trace", "convert", "azure", str(source), "--out", str(tmp_path / "o.jsonl")]
    )
    assert "azure.csv:3" in line and "--skip-invalid" in line and "skip_invalid" not in line


def test_metrics_given_a_trace_says_so(tmp_path: Path) -> None:
    trace = trace_file(tmp_path)
    line = error_line(["metrics", str(trace)])
    assert f"{trace}:1:" in line and "looks like a trace" in line and "simulate --out" in line
    with_ids = tmp_path / "ids.jsonl"
    with_ids.write_text(
        "".join(
            json.dumps({**json.loads(text), "request_id": f"r{i}"}) + "\n"
            for i, text in enumerate(trace.read_text().splitlines())
        )
    )
    assert "looks like a trace" in error_line(["metrics", str(with_ids)])


def test_weights_out_for_an_unweighted_suite_writes_nothing(tmp_path: Path) -> None:
    out, weights = tmp_path / "t.jsonl", tmp_path / "w.json"
    line = error_line(
        ["trace", "gen", "overload", "--out", str(out), "--weights-out", str(weights)]
    )
    assert "--weights-out" in line and "overload-weighted" in line
    assert not out.exists() and not weights.exists()


@pytest.mark.parametrize("weight", [0, -1, "heavy", 1e-300, 1e-320, 1000, 1e300, True])
def test_bad_weight_names_the_client(tmp_path: Path, weight: object) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"c0": 1, "c1": weight}))
    line = error_line(["simulate", "--trace", str(trace_file(tmp_path)), "--weights", str(path)])
    assert f"{path}:1" in line and "'c1'" in line and "from 0.01 to 100" in line


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("w.json", '{"c0": 1,\n "c0": 5}', "w.json:2: the key 'c0' is given twice"),
        (
            "w.yaml",
            "groups: {org: {weight: 2}}\nclients:\n  c0: {group: org}\n  c0: {weight: 3}\n",
            "w.yaml:4: the key 'c0' is given twice in one mapping (first at line 3)",
        ),
        (
            "w.yaml",
            "groups: {org: {weight: 1000}}\nclients: {c0: {group: org}}\n",
            "w.yaml:1: groups.org.weight: must be a number from 0.01 to 100",
        ),
        (
            "w.yaml",
            "groups: {org: {weight: true}}\nclients: {c0: {group: org}}\n",
            "w.yaml:1: groups.org.weight: must be a number from 0.01 to 100",
        ),
    ],
)
def test_a_weights_file_mistake_is_refused_at_its_line(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    line = error_line(["simulate", "--trace", str(trace_file(tmp_path)), "--weights", str(path)])
    assert expected in line


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--tenants", "tenants.yaml", "--tenant-from-user"],
            "--tenant-from-user and --tenants exclude each other",
        ),
        (["--metrics-host", "0.0.0.0"], "--metrics-host is the address of --metrics-port"),
        (["--model", "sim:zero", "--device", "cpu"], "--device is for a real model"),
        (["--model", "sim:zero", "--dtype", "float16"], "--dtype is for a real model"),
        (["--model", "sim:zero", "--decode-kernel", "c"], "--decode-kernel is for a real model"),
        (["--decode-kernel", "flash"], "--decode-kernel is c, triton or torch, not 'flash'"),
        (["--swap-tokens", "4096"], "--swap-tokens sizes the swap area of --preemption swap"),
        (
            ["--charge-cached-tokens", "0.5"],
            "--charge-cached-tokens prices prompt tokens served from the prefix cache: "
            "give --enable-prefix-caching too",
        ),
    ],
)
def test_serve_refuses_options_that_exclude_each_other(options: list[str], expected: str) -> None:
    """Given together, one would be silently ignored: both named, nothing started."""
    line = error_line(["serve", "--model", "sim:zero", *options])
    assert expected in line


def test_empty_inputs_follow_one_rule(tmp_path: Path) -> None:
    """An input without a single request is an error in every command."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert f"{empty}: the trace holds no requests" in error_line(
        ["simulate", "--trace", str(empty)]
    )
    assert f"{empty}: the trace holds no requests" in error_line(
        ["experiment", "compare", "--trace", str(empty), "--out", str(tmp_path / "cmp")]
    )
    assert f"{empty}: the results file holds no requests" in error_line(["metrics", str(empty)])
    source = tmp_path / "azure.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    out = tmp_path / "o.jsonl"
    line = error_line(["trace", "convert", "azure", str(source), "--out", str(out)])
    assert "no request to convert" in line and not out.exists()


def test_engine_preset_needs_a_pool(tmp_path: Path) -> None:
    line = error_line(["simulate", "--trace", str(trace_file(tmp_path)), "--preset", "engine"])
    assert "--preset engine needs --kv-tokens" in line


def test_config_errors_speak_of_options(tmp_path: Path) -> None:
    line = error_line(
        ["simulate", "--trace", str(trace_file(tmp_path)), "--preset", "engine", "--kv-tokens", "8"]
    )
    assert "--kv-tokens (8) is smaller than one block" in line


def test_metrics_window_and_warmup_errors(tmp_path: Path) -> None:
    results = results_file(tmp_path)
    assert "must exceed the warm-up" in error_line(["metrics", str(results), "--warmup", "100"])
    assert "window must be > 0" in error_line(
        ["metrics", str(results), "--window", "0", "--warmup", "1"]
    )


def test_unknown_suite_and_missing_out(tmp_path: Path) -> None:
    assert "unknown suite 'nope'" in error_line(
        ["trace", "gen", "nope", "--out", str(tmp_path / "x")]
    )
    assert "--out FILE is required" in error_line(["trace", "gen", "overload"])


def test_compare_needs_a_folder(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    line = error_line(
        ["experiment", "compare", "--trace", str(trace_file(tmp_path)), "--out", str(file)]
    )
    assert f"--out {file} is a file" in line


def test_weights_file_that_cannot_be_read(tmp_path: Path) -> None:
    trace = str(trace_file(tmp_path))
    missing = tmp_path / "absent.json"
    line = error_line(["simulate", "--trace", trace, "--weights", str(missing)])
    assert f"cannot read weights file {missing}: No such file or directory" in line
    broken = tmp_path / "w.json"
    broken.write_text('{"c0": 1,\n')
    line = error_line(["simulate", "--trace", trace, "--weights", str(broken)])
    assert f"weights file {broken}:2: not JSON" in line


def test_experiment_outputs_and_profile_checked_first(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    line = error_line(["experiment", "paper", "--out", str(file), "--shared", str(tmp_path)])
    assert f"--out {file} is a file" in line
    line = error_line(
        [
            "experiment",
            "compare",
            "--trace",
            str(trace_file(tmp_path)),
            "--profile",
            "nope",
            "--out",
            str(tmp_path / "c"),
        ]
    )
    assert "unknown profile 'nope'" in line and not (tmp_path / "c").exists()


def test_output_in_a_new_folder_is_made_before_the_work(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "r.jsonl"
    result = runner.invoke(
        app, ["simulate", "--trace", str(trace_file(tmp_path)), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_a_metrics_port_that_is_the_api_port_is_refused() -> None:
    line = error_line(["serve", "--model", "sim:zero", "--port", "8123", "--metrics-port", "8123"])
    assert "--metrics-port must differ from --port (8123)" in line
