"""A policy of one's own on the command line: `--policy mypkg.mod:MyPolicy(key=value)`
runs, an installed one is listed, and a bad spec is one line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_cli_errors import error_line
from tests.user_policies import MODULE, SOURCE, install_distribution, install_module
from tokenfair.cli import app

runner = CliRunner()


def burst(tmp_path: Path) -> Path:
    """Twelve long prompts at once: most wait, so the waiting order shows."""
    path = tmp_path / "burst.jsonl"
    rows = [
        {"arrival_s": i * 0.01, "client": f"c{i % 2}", "input_tokens": 2000, "output_tokens": 20}
        for i in range(12)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tokenfair(args: list[str], pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, with their module's folder on PYTHONPATH."""
    paths = [str(pythonpath), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    return subprocess.run(
        [sys.executable, "-m", "tokenfair.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def served_order(results: Path) -> list[str]:
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    return [r["request_id"] for r in sorted(rows, key=lambda r: r["first_token_s"])]


def test_simulate_runs_a_policy_from_pythonpath(tmp_path: Path) -> None:
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    trace = burst(tmp_path)
    out = tmp_path / "newest.jsonl"
    spec = f"{MODULE}:Newest(scale=2, tag='a b')"
    done = tokenfair(
        ["simulate", "--trace", str(trace), "--policy", spec, "--out", str(out)], tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["policy"] == "Newest"
    # r0 is alone when it arrives; then the newest waiting goes first, unlike fcfs.
    assert served_order(out) == ["r0", *(f"r{i}" for i in range(11, 0, -1))]
    fcfs = tmp_path / "fcfs.jsonl"
    done = tokenfair(
        ["simulate", "--trace", str(trace), "--policy", "fcfs", "--out", str(fcfs)], tmp_path
    )
    assert served_order(fcfs) == [f"r{i}" for i in range(12)]

    bad = tokenfair(["simulate", "--trace", str(trace), "--policy", f"{MODULE}:Nope"], tmp_path)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"error: policy '{MODULE}:Nope': module '{MODULE}' has no class 'Nope' (its policies: "
        "Broken, Cached, DeclaresTheCache, Newest, NotInVllm, OldStyle, OwnCharge, Plain)"
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "tf_no_such_policy_module:X",
            "error: policy 'tf_no_such_policy_module:X': cannot import module "
            "'tf_no_such_policy_module': No module named 'tf_no_such_policy_module'",
        ),
        ("{m}:NotAPolicy", "is not a policy class"),
        ("{m}:Newest(bogus=1)", "got an unexpected keyword argument 'bogus'"),
        ("{m}:Newest(scale=huge)", "argument scale=huge is not a Python literal"),
        ("{m}:Newest(scale=-1)", "error: policy '{m}:Newest(scale=-1)': scale must be > 0"),
    ],
)
def test_a_bad_spec_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, expected: str
) -> None:
    module = install_module(tmp_path, monkeypatch)
    trace = burst(tmp_path)
    line = error_line(["simulate", "--trace", str(trace), "--policy", spec.format(m=module)])
    assert expected.format(m=module) in line


def test_a_policy_module_not_found_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_module(tmp_path, monkeypatch)
    (tmp_path / "tf_policies_broken.py").write_text("import tf_missing_dependency\n")
    here = tmp_path / "here"
    here.mkdir()
    (here / "tf_policies_here.py").write_text("")
    monkeypatch.chdir(here)  # the file is here, but the current directory is not searched
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    simulate = ["simulate", "--trace", str(burst(tmp_path))]
    line = error_line([*simulate, "--policy", "tf_policies_here:Mine"])
    assert "looked for tf_policies_here.py or tf_policies_here/ in PYTHONPATH (/elsewhere)" in line
    assert f"not in the current directory ({here}, which holds tf_policies_here.py)" in line
    assert line.endswith("run with PYTHONPATH=. or install the module")
    # A module that is found but imports something missing: its own error, no search.
    line = error_line([*simulate, "--policy", "tf_policies_broken:X"])
    assert "tf_missing_dependency" in line and "looked for" not in line


def test_compare_runs_a_policy_whose_arguments_hold_commas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = install_module(tmp_path, monkeypatch)
    spec = f"{module}:Newest(scale=2, tag='a/b')"
    out = tmp_path / "cmp"
    args = ["experiment", "compare", "--trace", str(burst(tmp_path)), "--out", str(out)]
    result = runner.invoke(
        app, [*args, "--policies", f"fcfs,{spec}", "--duration", "10", "--warmup", "0"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "metrics.json").read_text())
    assert spec in json.dumps(summary)
    # A spec's slash cannot make a folder of its results file.
    assert (out / "results" / "burst" / "Newest-scale=2-tag=-a-b.jsonl").is_file()  # its label
    line = error_line([*args, "--policies", "fcfs,tf_nope.mod:P(a=1, b=2)"])
    assert "policy 'tf_nope.mod:P(a=1, b=2)': cannot import module 'tf_nope.mod'" in line


def test_policies_lists_the_installed_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_distribution(tmp_path, monkeypatch)
    result = runner.invoke(app, ["policies"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells[1]
        for line in result.output.splitlines()
        if len(cells := [c.strip() for c in line.strip("│┃ ").split("│")]) == 2
    }
    assert rows["vtc"] == "Virtual Token Counter with the paper's lift rule"
    assert rows["newest (installed)"] == "Newest arrival first (last come, first served)."
    assert rows["broken (installed)"].startswith("cannot load: policy 'broken' (entry point ")
    assert "No module named 'tf_no_such_policy_module'" in rows["broken (installed)"]
    assert list(rows).index("newest (installed)") > list(rows).index("dlpm[:quantum]")


def test_serve_refuses_a_bad_spec_in_one_line() -> None:
    pytest.importorskip("fastapi")
    line = error_line(
        ["serve", "--model", "sim:a10g-llama-7b", "--policy", "tf_nope:X(a=[1, 2])", "--port", "1"]
    )
    assert line.startswith(
        "error: policy 'tf_nope:X(a=[1, 2])': cannot import module 'tf_nope': "
        "No module named 'tf_nope'; looked for tf_nope.py or tf_nope/ in "
    )


def test_the_example_policy_runs_in_simulate_and_compare(tmp_path: Path) -> None:
    """examples/least_attained.py, unchanged, from the command line."""
    examples = Path(__file__).resolve().parents[1] / "examples"
    rows = [
        {"arrival_s": 0.0, "client": "heavy", "input_tokens": 2000, "output_tokens": 20}
    ] * 8 + [{"arrival_s": 0.5, "client": "light", "input_tokens": 200, "output_tokens": 20}]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({**row, "request_id": f"r{i}"}) + "\n"
                             for i, row in enumerate(rows)))  # fmt: skip
    spec = "least_attained:LeastAttainedService(half_life_s=5)"
    out = tmp_path / "las.jsonl"
    done = tokenfair(
        ["simulate", "--trace", str(trace), "--policy", spec, "--out", str(out)], examples
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["policy"] == "least-attained"
    # The light client, arriving behind eight heavy prompts, is served before the last
    # of them: it has attained nothing.
    order = served_order(out)
    assert order.index("r8") < order.index("r7")
    compared = tokenfair(
        ["experiment", "compare", "--trace", str(trace), "--policies", f"fcfs,{spec}",
         "--duration", "20", "--warmup", "0", "--window", "5", "--workers", "1",
         "--out", str(tmp_path / "compare")],
        examples,
    )  # fmt: skip
    assert compared.returncode == 0, compared.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_policy_failing_in_a_hook_is_one_line_and_the_others_are_written(
    tmp_path: Path, workers: int
) -> None:
    """A policy raising inside a hook: one line naming it, the hook and the error, exit
    status 1, and the other policies' results, metrics and report written all the same
    (in this process and from a pool's worker)."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(SOURCE)
    out = tmp_path / "cmp"
    args = ["experiment", "compare", "--trace", str(burst(tmp_path)), "--out", str(out)]
    policies = f"fcfs,{MODULE}:Broken,vtc"
    options = ["--policies", policies, "--workers", str(workers), "--duration", "10"]
    options += ["--warmup", "0"]
    result = tokenfair([*args, *options], folder)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: policy '{MODULE}:Broken' failed in on_admit on burst: "
        "ZeroDivisionError: the third admission"
    ], result.stderr
    summary = json.loads((out / "metrics.json").read_text())
    assert {run["policy"] for run in summary["runs"]} == {"fcfs", "vtc"}
    assert summary["failures"] == [lines[0].removeprefix("error: ")]
    assert (out / "results" / "burst" / "vtc.jsonl").is_file()
    assert (out / "report.md").is_file()


def test_two_policies_called_alike_in_reports_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = install_module(tmp_path, monkeypatch)
    both = f"{module}:Newest(label='x'),{module}:Newest(scale=2, label='x')"
    line = error_line(
        ["experiment", "compare", "--trace", str(burst(tmp_path)), "--policies", both]
    )
    assert "are both called 'x' in reports: give one a label" in line


def test_compare_on_the_engine_preset_with_prefix_caching(tmp_path: Path) -> None:
    # Two clients, each asking again and again over its own 1,024-token document.
    trace = tmp_path / "docs.jsonl"
    rows = [
        {
            "arrival_s": i * 0.05, "client": f"c{i % 2}", "input_tokens": 1100,
            "output_tokens": 16, "prefix_group": f"doc{i % 2}", "prefix_tokens": 1024,
        }
        for i in range(40)
    ]  # fmt: skip
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["experiment", "compare", "--trace", str(trace), "--policies", "fcfs,vtc"]
    args += ["--duration", "10", "--warmup", "0", "--window", "5"]
    assert "--preset engine needs --kv-tokens" in error_line([*args, "--preset", "engine"])
    runs = {}
    for caching in ("--prefix-caching", "--no-prefix-caching"):
        out = tmp_path / caching
        result = runner.invoke(
            app, [*args, "--out", str(out), "--preset", "engine", "--kv-tokens", "8000", caching]
        )
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "metrics.json").read_text())
        settings = summary["settings"]
        assert (settings["preset"], settings["kv_tokens"]) == ("engine", 8000)
        assert settings["prefix_caching"] == (caching == "--prefix-caching")
        assert "on the engine preset" in (out / "report.md").read_text()
        runs[caching] = {r["policy"]: r for r in summary["runs"]}
    # The cache saves prefill: every policy ends no later with it than without.
    for policy in ("fcfs", "vtc"):
        cached, uncached = runs["--prefix-caching"][policy], runs["--no-prefix-caching"][policy]
        assert cached["makespan_s"] < uncached["makespan_s"]


def test_compare_sweeps_a_policys_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_module(tmp_path, monkeypatch)
    out = tmp_path / "sweep"
    args = ["experiment", "compare", "--trace", str(burst(tmp_path)), "--out", str(out)]
    result = runner.invoke(
        app,
        [*args, "--policies", "fcfs", "--sweep", f"{module}:Newest(scale=[1, 3])",
         "--duration", "10", "--warmup", "0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    labels = [r["label"] for r in json.loads((out / "metrics.json").read_text())["runs"]]
    assert labels == ["fcfs", "Newest(scale=1)", "Newest(scale=3)"]
    line = error_line([*args, "--sweep", "rpm:5"])
    assert line.startswith("error: --sweep: sweep 'rpm:5': only a policy of one's own")
