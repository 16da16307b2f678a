"""The long-context-neighbour experiment: its rows, what sharing what a tenant holds
gives the chat tenants, and its report section."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tokenfair.experiments.neighbor import (
    ALONE,
    CASES,
    RUNS,
    SWEEP,
    neighbor_jobs,
    neighbor_rows,
)
from tokenfair.experiments.runner import run_jobs
from tokenfair.report.document import to_markdown
from tokenfair.report.neighbor_report import neighbor_blocks, plot_step_share

SHORT = tuple(replace(case, spec=replace(case.spec, duration_s=60.0)) for case in CASES)


@pytest.fixture(scope="module")
def rows():
    jobs = neighbor_jobs([0], RUNS + SWEEP[:2], SHORT)
    return neighbor_rows(run_jobs(jobs, workers=1))


def row(rows, case: str, run: str):
    return next(r for r in rows if r.case == case and r.run == run)


def test_every_case_has_the_chat_traffic_alone_and_every_run(rows):
    for case in ("a10g", "h200"):
        labels = {r.run for r in rows if r.case == case}
        assert labels == {ALONE, *(label for label, _, _ in RUNS + SWEEP[:2])}
        alone = row(rows, case, ALONE)
        assert alone.long_tok_s is None and alone.ttft_p99_x_alone == pytest.approx(1.0)
        assert row(rows, case, "fcfs").long_x_fcfs == pytest.approx(1.0)


def test_sharing_what_the_long_tenant_holds_brings_the_chat_tenants_back(rows):
    for case in ("a10g", "h200"):
        before = row(rows, case, "vtc, charges only")
        shared = row(rows, case, "vtc (default: holdings shared)")
        assert shared.chat_ttft_p99_s < before.chat_ttft_p99_s / 3
        assert shared.long_x_fcfs > 0.9


def test_the_report_section_and_the_trade_figure(rows, tmp_path: Path):
    figure = plot_step_share(rows, tmp_path)
    assert figure is not None and (tmp_path / figure).stat().st_size > 0
    text = to_markdown(neighbor_blocks(rows, figure))
    assert "A long-context neighbour" in text and text.count("| chat alone |") == 2
    assert SWEEP[0][0] not in text  # the sweep is in the figure, not the tables
    assert neighbor_blocks([], None) == []
