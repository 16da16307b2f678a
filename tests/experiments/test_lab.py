"""The notebook API as docs/experiments.md shows it: its code block runs as written and
gives the numbers `tokenfair experiment compare` writes for the same inputs."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenfair import lab
from tokenfair.bundled import dataset
from tokenfair.cli import app
from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.experiments.runner import PolicyFailed

DOCS = Path(__file__).resolve().parents[2] / "docs" / "experiments.md"


def documented_block() -> str:
    section = DOCS.read_text().split("## In a notebook", 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_documented_notebook_block_gives_the_compare_commands_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    namespace: dict[str, object] = {"__name__": "notebook"}
    with contextlib.redirect_stdout(printed):
        exec(compile(documented_block(), str(DOCS), "exec"), namespace)
    rows = {row.label: row for row in lab.table(namespace["runs"])}  # type: ignore[arg-type]
    assert list(rows) == ["fcfs", "vtc", "shortest-prompt"]
    assert "shortest-prompt  Max Diff" in printed.getvalue()
    for path in namespace["figures"]:  # type: ignore[attr-defined]
        assert path.read_bytes()[:4] == b"\x89PNG"
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        app,
        ["experiment", "compare", "--trace", str(dataset("arena").path), "--out", str(out),
         "--policies", "fcfs,vtc", "--duration", "600"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for run in json.loads((out / "metrics.json").read_text())["runs"]:
        row = rows[run["policy"]]
        assert (row.max_diff, row.avg_diff, row.throughput_tok_s) == (
            run["max_diff"], run["avg_diff"], run["throughput_tok_s"],
        )  # fmt: skip


def test_the_engine_preset_needs_a_pool_and_a_failing_hook_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs kv_tokens"):
        lab.config("engine")
    assert lab.config("engine", kv_tokens=4096).enable_prefix_caching
    assert not lab.config("paper").enable_prefix_caching
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"arrival_s": i, "client": "a", "input_tokens": 8, "output_tokens": 4})
            + "\n"
            for i in range(5)
        )
    )
    workload = lab.trace(trace)
    assert workload.duration_s == 4.0  # the last arrival, as compare has it

    class Failing(FCFSPolicy):
        name = "failing"

        def on_admit(self, request, first_time, now):
            raise ZeroDivisionError("on purpose")

    with pytest.raises(PolicyFailed, match="'failing' failed in on_admit on t: ZeroDivision"):
        lab.run(workload, Failing())
    # In a comparison, as `experiment compare` does: the others' runs kept, it left out.
    with pytest.warns(UserWarning, match="left out: policy 'failing' failed in on_admit"):
        runs = lab.compare(lab.trace(trace, warmup_s=1, window_s=2), ["fcfs", Failing(), "vtc"])
    assert [run.label for run in runs] == ["fcfs", "vtc"]
    assert [failure.hook for failure in runs.failures] == ["on_admit"]
    assert lab.PolicyFailed is PolicyFailed and issubclass(lab.PolicyError, ValueError)
