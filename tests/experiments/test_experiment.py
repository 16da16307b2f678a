"""Experiments end to end: runs, files written, numbers equal to a direct computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.user_policies import MODULE, install_module
from tokenfair.commands.experiment import experiment_app, print_summary
from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.experiments.ablation import ablation_points, ablation_workload
from tokenfair.experiments.experiment import (
    PAPER_POLICIES,
    run_experiment,
    run_paper_experiment,
)
from tokenfair.experiments.locality import LOCALITY_POLICIES, LOCALITY_POOLS
from tokenfair.experiments.paper_table import PAPER_ARENA_TABLE, PAPER_LABEL
from tokenfair.experiments.runner import Job, run_job
from tokenfair.experiments.targets import check_targets, linear_fit
from tokenfair.experiments.workloads import ARENA, Workload
from tokenfair.fairness.bounds import service_bound
from tokenfair.fairness.curves import service_in_interval
from tokenfair.fairness.report import fairness_report
from tokenfair.report.experiment_report import SIMULATED_LABEL, arena_table_rows, publish
from tokenfair.results import read_results
from tokenfair.workloads.arrivals import Uniform
from tokenfair.workloads.lengths import fixed
from tokenfair.workloads.suites import ClientWorkload, generate_workload
from tokenfair.workloads.trace import TraceRecord, write_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny_workload() -> Workload:
    """Two clients, one asking twice as much, 90 s: a miniature `overload`."""
    clients = [
        ClientWorkload("client-0", Uniform(1.5), fixed(64, 64)),
        ClientWorkload("client-1", Uniform(3.0), fixed(64, 64)),
    ]
    suite = generate_workload(clients, 90.0, seed=1, name="tiny")
    return Workload(
        "tiny", tuple(suite.records), 90.0, "tiny overload", window_s=20.0, warmup_s=10.0
    )


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    result = run_experiment([tiny_workload()], ["fcfs", "vtc"], out, workers=1)
    publish(result)
    return result


# Beside the paper's: a policy of one's own under a label, and one whose hook raises.
MINE = f"{MODULE}:Newest(scale=2, label='newest')"
BROKEN = f"{MODULE}:Broken"


@pytest.fixture(scope="module")
def quick_paper(tmp_path_factory, shared_dir):
    """The quick paper experiment on the arena trace, every suite and the locality
    experiment (no ablation, no long-context neighbour), with a policy of one's own and
    a failing one beside the paper's."""
    out = tmp_path_factory.mktemp("paper")
    with pytest.MonkeyPatch.context() as monkeypatch:
        install_module(tmp_path_factory.mktemp("policies"), monkeypatch)
        result = run_paper_experiment(
            out,
            True,
            shared_dir,
            ablation=False,
            neighbor=False,
            extra_policies=[MINE, BROKEN],
        )
        publish(result)
    return result


def test_tiny_experiment_writes_report_figures_and_results(tiny_experiment):
    out = tiny_experiment.out_dir
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    for name in ("service_rate", "response_time", "service_difference"):
        assert_png(out / "figures" / f"tiny_{name}.png")
    figures = sorted((out / "figures").glob("*.png"))
    assert figures
    for path in figures:
        assert_png(path)
        assert f"](figures/{path.name})" in (out / "report.md").read_text()
    assert read_results(out / "results" / "tiny" / "vtc.jsonl")
    summary = json.loads((out / "metrics.json").read_text())
    assert [r["policy"] for r in summary["runs"]] == ["fcfs", "vtc"]


def test_report_numbers_equal_a_direct_fairness_report(tiny_experiment):
    workload = tiny_workload()
    for policy in ("fcfs", "vtc"):
        sim = simulate(
            list(workload.records),
            make_policy(policy),
            load_profile("a10g-llama-7b"),
            SchedulerConfig.paper(),
        )
        direct = fairness_report(sim.results, duration_s=90.0, window_s=20.0, warmup_s=10.0)
        row = next(r for r in tiny_experiment.rows_for("tiny") if r.policy == policy)
        for key in ("max_diff", "avg_diff", "diff_var", "throughput_tok_s"):
            assert getattr(row, key) == pytest.approx(getattr(direct, key), rel=1e-12, abs=1e-9), (
                key
            )
        report = (tiny_experiment.out_dir / "report.md").read_text()
        assert f"| {policy} | {direct.max_diff:,.2f} | {direct.avg_diff:,.2f} |" in report


def test_saved_results_rescore_to_the_reported_row(tiny_experiment):
    records = read_results(tiny_experiment.out_dir / "results" / "tiny" / "fcfs.jsonl")
    again = fairness_report(records, duration_s=90.0, window_s=20.0, warmup_s=10.0)
    row = tiny_experiment.rows_for("tiny")[0]
    assert again.max_diff == pytest.approx(row.max_diff)


@pytest.mark.slow
def test_quick_arena_table_has_every_scheduler(quick_paper):
    arena = [row.policy for row in quick_paper.rows_for(ARENA)]
    assert arena == [*PAPER_POLICIES, MINE]
    assert [row.policy for row in quick_paper.rows_for("overload")] == ["fcfs", "vtc", MINE]
    rows = arena_table_rows(quick_paper.outcomes_for(ARENA))
    # Ours for every scheduler, the paper's beside each one it measured.
    assert sum(r[1] == PAPER_LABEL for r in rows) == len(PAPER_ARENA_TABLE)
    report = quick_paper.report_md.read_text()
    for policy in PAPER_POLICIES:
        assert f"| {policy} | tokenfair (simulated) |" in report
    html = quick_paper.report_html.read_text()
    assert "<table>" in html and 'src="figures/arena_table.png"' in html


def test_quick_paper_report_compares_fcfs_ttft_with_the_measured_run(quick_paper):
    assert len(quick_paper.measured_fcfs_arena) == 1500
    assert_png(quick_paper.out_dir / "figures" / "arena_ttft_validation.png")
    report = quick_paper.report_md.read_text()
    assert "](figures/arena_ttft_validation.png)" in report
    assert "per-request absolute error median" in report


@pytest.mark.slow
def test_quick_paper_checks_every_target(quick_paper):
    names = {t.name for t in quick_paper.targets}
    assert {"vtc-max-diff", "lcf-max-diff", "rpm5-throughput", "overload-vtc-bound"} <= names
    # Every target could be evaluated: the runs it needs were all part of the experiment.
    assert all(t.passed is not None for t in quick_paper.targets)
    fcfs = next(r for r in quick_paper.rows_for(ARENA) if r.policy == "fcfs")
    vtc = next(r for r in quick_paper.rows_for(ARENA) if r.policy == "vtc")
    check = next(t for t in quick_paper.targets if t.name == "vtc-max-diff")
    assert check.passed == (vtc.max_diff <= 0.55 * fcfs.max_diff)


@pytest.mark.slow
def test_the_quick_paper_run_reports_the_locality_experiment(quick_paper, capsys):
    locality = quick_paper.locality
    assert locality is not None
    assert {(r.suite, r.policy) for r in locality.rows} == {
        (suite, policy) for suite in LOCALITY_POOLS for policy in LOCALITY_POLICIES
    }
    # Its runs are its own, not extra draws of the paper's suites.
    assert not quick_paper.seed_outcomes and not quick_paper.seed_spreads
    assert "## Fair and cache-efficient: prefix locality" in quick_paper.report_md.read_text()
    summary = json.loads((quick_paper.out_dir / "metrics.json").read_text())
    assert len(summary["locality"]["rows"]) == len(locality.rows)
    assert "seeds" not in summary
    assert (quick_paper.out_dir / "results" / "system-prompt" / "dlpm_seed-0.jsonl").is_file()
    print_summary(quick_paper, ARENA)
    assert "Clients sharing prompt prefixes" in capsys.readouterr().out


def test_targets_without_runs_are_not_evaluated():
    assert all(t.passed is None for t in check_targets([]))


def test_linear_fit_of_a_line_and_of_noise():
    slope, r2 = linear_fit([0, 1, 2, 3], [1, 3, 5, 7])
    assert slope == pytest.approx(2.0) and r2 == pytest.approx(1.0)
    _, r2 = linear_fit([0, 1, 2, 3], [0, 5, 0, 5])
    assert r2 < 0.5


def test_service_bound_is_the_larger_of_prompt_and_pool():
    records = [TraceRecord(0.0, "a", 300, 10, "r0")]
    assert service_bound(records, kv_tokens=10_000) == 20_000
    assert service_bound(records, kv_tokens=100) == 300


def test_ablation_sweeps_pool_and_length_at_equal_token_demand():
    points = ablation_points()
    assert {(p.kv_tokens, p.length) for p in points} == {
        (10_000, 256),
        (35_000, 256),
        (65_000, 256),
        (10_000, 512),
        (10_000, 768),
    }
    short = ablation_workload(points[0])
    long = ablation_workload(next(p for p in points if p.length == 768))
    tokens = [sum(r.input_tokens + r.output_tokens for r in w.records) for w in (short, long)]
    assert tokens[1] == pytest.approx(tokens[0], rel=0.02)


def test_weights_reach_only_weighted_vtc():
    clients = [
        ClientWorkload("client-0", Uniform(4.0), fixed(128, 128)),
        ClientWorkload("client-1", Uniform(8.0), fixed(128, 128)),
    ]
    records = tuple(generate_workload(clients, 60.0, seed=3).records)  # both backlogged
    plain = Workload("plain", records, 60.0, window_s=20.0, warmup_s=10.0)
    weighted = Workload("w", records, 60.0, weights={"client-0": 3.0, "client-1": 1.0},
                        window_s=20.0, warmup_s=10.0)  # fmt: skip
    vtc, wvtc = (run_job(Job(weighted, p)) for p in ("vtc", "wvtc"))
    unweighted = run_job(Job(plain, "vtc"))
    assert [r.first_token_s for r in vtc.results] == [r.first_token_s for r in unweighted.results]
    # Within [warmup, T]: over the whole run every backlog drains and shares equal demand.
    served = {o.policy: service_in_interval(o.results, 10.0, 60.0) for o in (vtc, wvtc)}
    assert served["wvtc"]["client-0"] > 1.1 * served["vtc"]["client-0"]


def test_compare_command_on_a_small_trace(tmp_path):
    trace = tmp_path / "small.jsonl"
    write_trace(tiny_workload().records, trace)
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        experiment_app,
        [
            "compare",
            "--trace", str(trace),
            "--policies", "fcfs,vtc",
            "--out", str(out),
            "--duration", "90", "--window", "20", "--warmup", "10",
            "--workers", "1",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "fcfs" in result.output and "report.md" in result.output
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert_png(out / "figures" / "small_service_rate.png")
    assert {r["policy"] for r in json.loads((out / "metrics.json").read_text())["runs"]} == {
        "fcfs",
        "vtc",
    }


def test_compare_command_rejects_an_unknown_policy(tmp_path):
    trace = tmp_path / "small.jsonl"
    write_trace(tiny_workload().records, trace)
    result = CliRunner().invoke(
        experiment_app, ["compare", "--trace", str(trace), "--policies", "fcfs,nope"]
    )
    assert result.exit_code == 2
    assert "nope" in result.output


@pytest.mark.slow
def test_ones_own_policy_joins_the_paper_report_under_its_label(quick_paper):
    out = quick_paper.out_dir
    report = (out / "report.md").read_text()
    # In the arena table and the suite's, under its label; its results file too.
    assert f"| newest | {SIMULATED_LABEL} |" in report  # the arena table
    assert "| newest | " in report.split("## Synthetic suites", 1)[-1]  # the suite's
    assert (out / "results" / "overload" / "newest.jsonl").is_file()
    # Beside FCFS and VTC in the suite's per-client panels (a few policies: every one).
    caption = next(line for line in report.splitlines() if "window, under" in line)
    assert "newest" in caption
    # The failing one: one line naming it and its hook, left out, the rest written.
    assert [f for f in quick_paper.failures if "Broken" in f and "on_admit" in f]
    assert "Left out:" in report and BROKEN not in quick_paper.settings["policies"]
    summary = json.loads((out / "metrics.json").read_text())
    assert {r["label"] for r in summary["runs"]} >= {"newest", "vtc"}


@pytest.mark.slow
def test_the_workloads_over_several_draws_give_each_policys_median_and_range(tmp_path, shared_dir):
    from tokenfair.experiments.seeds import jittered
    from tokenfair.experiments.workloads import arena_workload, suite_workload

    result = run_paper_experiment(
        tmp_path, True, shared_dir, suites=["overload"], ablation=False, locality=False,
        neighbor=False, seeds=3,
    )  # fmt: skip
    publish(result)
    # The tables keep draw 0, as without seeds.
    assert [o.job.variant for o in result.outcomes_for("overload")] == ["", ""]
    assert {o.job.variant for o in result.outcomes_for(ARENA)} == {""}
    spreads = {(row.suite, row.policy): row for row in result.seed_spreads}
    assert sorted(p for s, p in spreads if s == "overload") == ["fcfs", "vtc"]
    assert sorted(p for s, p in spreads if s == ARENA) == sorted(PAPER_POLICIES)
    assert {r.seeds for r in spreads.values()} == {3}
    arena = arena_workload(shared_dir)
    draws_of = {
        "overload": lambda seed: suite_workload("overload", seed),
        ARENA: lambda seed: jittered(arena, seed) if seed else arena,  # arrivals +-1 ms
    }
    for workload, policy in [("overload", "fcfs"), ("overload", "vtc"), (ARENA, "vtc-artifact")]:
        row = spreads[workload, policy]
        draws = [
            run_job(Job(draws_of[workload](seed), policy, SchedulerConfig.paper()))
            for seed in range(3)
        ]
        values = sorted(d.report.max_diff for d in draws)
        assert (row.max_diff.low, row.max_diff.median, row.max_diff.high) == tuple(values)
        assert row.max_diff.mean == pytest.approx(sum(values) / 3)
        assert len(set(values)) > 1  # the draws differ: a range worth reporting
    report = (tmp_path / "report.md").read_text()
    assert "### Across seeds" in report and "| overload | the figure of two clients" in report
    assert "| arena (arrivals ±1 ms) | the real-trace table" in report
    assert "Moving every arrival of the arena trace by up to 1 ms (" in report
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["settings"]["seeds"] == 3 and len(summary["seeds"]) == 2 + len(PAPER_POLICIES)
    assert (tmp_path / "results" / "overload" / "vtc_seed-2.jsonl").is_file()
    assert (tmp_path / "results" / ARENA / "vtc_seed-2.jsonl").is_file()


@pytest.mark.slow
def test_the_docs_tables_are_what_this_code_measures(quick_paper):
    """docs/experiments.md's arena and suite tables, rendered from this run's
    metrics.json (`python -m tokenfair.report.docs_tables` prints them to paste)."""
    from tokenfair.report.docs_tables import arena_table, suites_table

    runs = json.loads((quick_paper.out_dir / "metrics.json").read_text())["runs"]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "experiments.md").read_text()
    for table in (arena_table(runs), suites_table(runs)):
        assert table in docs, f"docs/experiments.md should hold:\n{table}"


def test_the_ablation_figure_has_a_row_for_ones_own_policy(tmp_path, monkeypatch):
    from tokenfair.experiments.ablation import ablation_jobs
    from tokenfair.experiments.runner import run_jobs
    from tokenfair.report.figures import plot_ablation

    install_module(tmp_path, monkeypatch)
    # The point both sweeps share (a 10,000-token pool, 256/256 tokens): enough to draw.
    jobs = [
        j
        for j in ablation_jobs(["vtc", MINE])
        if j.config.kv_tokens == 10_000 and j.workload.records[0].input_tokens == 256
    ]
    assert len(jobs) == 2
    outcomes = run_jobs(jobs, workers=1)
    assert {o.label for o in outcomes} == {"vtc", "newest"}
    figure = plot_ablation(outcomes, tmp_path)
    image = plt_image_size(tmp_path / figure.path)
    assert image[1] > 1.5 * image[0] * 4.2 / 12  # two rows of panels: VTC, then newest


def plt_image_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its header."""
    header = path.read_bytes()[:24]
    assert header[:8] == PNG_MAGIC
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_compare_reports_the_prefix_hit_rate_where_prefix_caching_is_on(tmp_path):
    # Two clients each repeating a system prompt of their own: most prompt tokens hit.
    trace = tmp_path / "prompts.jsonl"
    records = [
        TraceRecord(i * 0.5, f"c{i % 2}", 600, 16, f"r{i}", prefix_group=f"sys{i % 2}",
                    prefix_tokens=512)
        for i in range(40)
    ]  # fmt: skip
    write_trace(records, trace)
    command = ["compare", "--trace", str(trace), "--policies", "fcfs,vtc", "--workers", "1",
               "--preset", "engine", "--kv-tokens", "4096", "--window", "5", "--warmup", "2"]  # fmt: skip
    cached = CliRunner().invoke(experiment_app, [*command, "--out", str(tmp_path / "on")])
    assert cached.exit_code == 0, cached.output
    assert "prefix hit" in cached.output
    summary = json.loads((tmp_path / "on" / "metrics.json").read_text())
    for run in summary["runs"]:
        assert run["prefix_hit_rate"] > 0.5
        assert set(run["cached_tokens"]) == {"c0", "c1"} and min(run["cached_tokens"].values())
        served = read_results(tmp_path / "on" / "results" / "prompts" / f"{run['policy']}.jsonl")
        assert sum(run["cached_tokens"].values()) == sum(r.cached_tokens for r in served)
    report = (tmp_path / "on" / "report.md").read_text()
    assert "prefix hit rate (%)" in report
    assert "Prompt tokens served from the prefix cache, per client and policy" in report
    plain = CliRunner().invoke(
        experiment_app, [*command, "--no-prefix-caching", "--out", str(tmp_path / "off")]
    )
    assert plain.exit_code == 0, plain.output
    assert "prefix hit" not in plain.output
    summary = json.loads((tmp_path / "off" / "metrics.json").read_text())
    assert {run["prefix_hit_rate"] for run in summary["runs"]} == {None}
    assert "prefix hit rate" not in (tmp_path / "off" / "report.md").read_text()


def test_a_comparisons_report_says_only_what_is_true_of_it(tiny_experiment):
    intro = tiny_experiment.report_md.read_text().split("## ", 1)[0]
    assert PAPER_LABEL not in intro and "mode)" not in intro
    assert "tiny: T = 90 s, w = 20 s, warmup = 10 s" in intro


def test_a_sweep_gets_a_table_and_a_figure_against_its_argument(tmp_path, monkeypatch):
    install_module(tmp_path, monkeypatch)
    trace = tmp_path / "small.jsonl"
    write_trace(tiny_workload().records, trace)
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        experiment_app,
        ["compare", "--trace", str(trace), "--policies", "fcfs,vtc", "--out", str(out),
         "--sweep", f"{MODULE}:Newest(scale=[1, 2, 4], tag=['a', 'b'])",
         "--duration", "90", "--window", "20", "--warmup", "10", "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # Each point's results file, named as its row, without a stray dash.
    assert (out / "results" / "small" / "Newest-scale=4-tag=-b.jsonl").is_file()
    sweep = json.loads((out / "metrics.json").read_text())["sweep"]
    assert sweep["varied"] == {"scale": [1, 2, 4], "tag": ["a", "b"]}
    assert [row["arguments"] for row in sweep["rows"]][:2] == [
        {"scale": 1, "tag": "a"},
        {"scale": 1, "tag": "b"},
    ]
    assert len(sweep["rows"]) == 6 and {row["workload"] for row in sweep["rows"]} == {"small"}
    report = (out / "report.md").read_text()
    assert "## Sweep over scale, tag" in report and "| small | 4 | 'b' |" in report
    assert "](figures/sweep.png)" in report
    assert_png(out / "figures" / "sweep.png")
