"""Every run of an experiment is called apart from the others: in its tables and by its
results file. Policies that would be called alike are refused before anything runs, in
one line, by every command and by tokenfair.lab; the writer never writes a file twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.user_policies import MODULE, install_module
from tokenfair import lab
from tokenfair.commands.experiment import experiment_app
from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.experiments.experiment import ExperimentResult, write_run_files
from tokenfair.experiments.naming import PolicyClash, results_stem
from tokenfair.experiments.runner import Job, run_job
from tokenfair.experiments.workloads import trace_workload


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    trace = tmp_path / "small.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"arrival_s": i, "client": f"c{i % 2}", "input_tokens": 8,
                        "output_tokens": 4}) + "\n"
            for i in range(6)
        )
    )  # fmt: skip
    return trace


def refused(args: list[str], out: Path) -> str:
    """The command's one-line error; it ran nothing and wrote nothing."""
    result = CliRunner().invoke(experiment_app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert not out.exists()
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    return result.output


@pytest.mark.parametrize(
    ("policies", "says"),
    [
        (f"{MODULE}:Newest(label='fcfs')", "as is the paper experiment's own 'fcfs'"),
        ("vtc", "'vtc' runs in the paper experiment already"),
        (f"{MODULE}:Newest(label='rpm-20')", "would write rpm-20.jsonl"),
        (f"{MODULE}:Newest(label='wvtc')", "own 'wvtc'"),
    ],
)
def test_paper_refuses_a_policy_called_like_one_of_its_own(tmp_path, monkeypatch, policies, says):
    install_module(tmp_path, monkeypatch)
    assert says in refused(["paper", "--quick", "--policies", policies], tmp_path / "out")


def test_compare_and_locality_refuse_a_policy_named_twice(tmp_path, monkeypatch, small_trace):
    install_module(tmp_path, monkeypatch)
    out = tmp_path / "out"
    compare = ["compare", "--trace", str(small_trace), "--policies"]
    assert "'vtc' is given twice" in refused([*compare, "vtc,vtc"], out)
    clash = f"vtc,{MODULE}:Newest(label='vtc')"
    assert "are both called 'vtc'" in refused([*compare, clash], out)
    weights = tmp_path / "weights.json"
    weights.write_text('{"c0": 2, "c1": 1}')
    mine = f"{MODULE}:Newest(label='wvtc')"
    assert "own 'wvtc'" in refused([*compare, mine, "--weights", str(weights)], out)
    assert "'dlpm' is given twice" in refused(["locality", "--policies", "dlpm,vtc,dlpm"], out)


def test_the_notebook_refuses_two_policies_called_alike(small_trace):
    workload = lab.trace(small_trace)

    class Mine(FCFSPolicy):
        name = "vtc"

    with pytest.raises(PolicyClash, match="given twice"):
        lab.compare(workload, ["fcfs", "fcfs"])
    with pytest.raises(lab.PolicyClash, match="both called 'vtc'"):
        lab.compare(workload, ["vtc", Mine()])


def test_the_writer_never_writes_a_results_file_twice(tmp_path, small_trace):
    workload = trace_workload(small_trace, window_s=2.0, warmup_s=1.0)
    runs = [run_job(Job(workload, "fcfs")), run_job(Job(workload, "fcfs"))]
    result = ExperimentResult("twice", tmp_path / "out", [workload], runs)
    with pytest.raises(PolicyClash, match="would both be written to"):
        write_run_files(result)
    assert not (tmp_path / "out").exists()


def test_results_files_are_named_without_stray_dashes():
    assert results_stem("capped-vtc(cap=500)") == "capped-vtc-cap=500"
    assert results_stem("DecayVTC(half_life_s=10, floor=0)") == "DecayVTC-half_life_s=10-floor=0"
    assert results_stem("rpm:20") == "rpm-20"


@pytest.mark.parametrize("command", ["paper", "locality"])
def test_fewer_than_one_seed_is_refused_in_one_line(tmp_path, command):
    assert refused([command, "--seeds", "0"], tmp_path / "out") == (
        "error: --seeds 0: give at least 1 draw (seed 0 is the one the tables show)\n"
    )
