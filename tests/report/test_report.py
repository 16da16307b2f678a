"""The report: Markdown and HTML from the same blocks, paragraphs written from numbers."""

from __future__ import annotations

import re

import pytest

from tokenfair.experiments.experiment import run_experiment
from tokenfair.experiments.workloads import Workload
from tokenfair.report.document import (
    Bullets,
    Heading,
    Image,
    Paragraph,
    Table,
    to_html,
    to_markdown,
)
from tokenfair.report.experiment_report import publish
from tokenfair.report.narrative import workload_paragraph
from tokenfair.workloads.arrivals import Uniform
from tokenfair.workloads.lengths import fixed
from tokenfair.workloads.suites import ClientWorkload, generate_workload

BLOCKS = [
    Heading("Title <1>", 1),
    Paragraph("Run `vtc` & friends."),
    Bullets(("one", "two")),
    Table(("policy", "Max Diff"), (("fcfs", "1|2"), ("vtc", "3")), "a caption"),
    Image("figures/a.png", "alt text", "a figure"),
]


def test_markdown_renders_every_block():
    text = to_markdown(BLOCKS)
    assert text.startswith("# Title <1>\n")
    assert "| policy | Max Diff |\n|---|---|\n| fcfs | 1\\|2 |" in text
    assert "- one\n- two" in text
    assert "![alt text](figures/a.png)" in text and "*a figure*" in text


def test_html_is_self_contained_escaped_and_relative():
    page = to_html(BLOCKS, "report")
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert "<h1>Title &lt;1&gt;</h1>" in page
    assert "<p>Run <code>vtc</code> &amp; friends.</p>" in page
    assert '<img src="figures/a.png" alt="alt text">' in page
    assert "<caption>a caption</caption>" in page
    # Nothing fetched from elsewhere: no scripts, no remote stylesheets or images.
    assert "<script" not in page and "http" not in page


def light_and_heavy() -> Workload:
    # client-0 asks for far less than half the capacity, client-1 for far more.
    clients = [
        ClientWorkload("client-0", Uniform(0.2), fixed(64, 64)),
        ClientWorkload("client-1", Uniform(6.0), fixed(64, 64)),
    ]
    suite = generate_workload(clients, 90.0, seed=2, name="light")
    return Workload(
        "light",
        tuple(suite.records),
        90.0,
        "a light and a heavy client",
        window_s=20.0,
        warmup_s=10.0,
    )


@pytest.fixture(scope="module")
def light_experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("light")
    result = run_experiment([light_and_heavy()], ["fcfs", "vtc"], out, workers=1)
    return result, publish(result)


def test_paragraph_is_written_from_the_runs_numbers(light_experiment):
    light_experiment, _ = light_experiment
    workload = light_experiment.workloads[0]
    outcomes = light_experiment.outcomes_for("light")
    text = workload_paragraph(workload, outcomes)
    fcfs, vtc = (o.report for o in outcomes)
    assert text.startswith("A light and a heavy client")
    assert f"Max Diff is {vtc.max_diff:.1f} against `fcfs`'s {fcfs.max_diff:.1f}" in text
    ratio = vtc.max_diff / fcfs.max_diff
    assert f"({ratio:.2f}x)" in text
    # The light client is not backlogged under VTC: the text reports its p90 TTFT.
    p90 = vtc.clients["client-0"].ttft_s.p90
    assert f"client-0, is not kept waiting under `vtc`: it waits {p90:.1f} s" in text


def test_report_has_a_paragraph_table_and_figures_per_workload(light_experiment):
    light_experiment, figures = light_experiment
    report = light_experiment.report_md.read_text()
    assert "### light" in report
    assert (
        workload_paragraph(light_experiment.workloads[0], light_experiment.outcomes_for("light"))
        in report
    )
    assert re.search(r"^\| fcfs \| [\d,.]+ \|", report, re.MULTILINE)
    for kind in ("service_rate", "response_time", "service_difference"):
        assert f"figures/light_{kind}.png" in report
    # No paper section without the arena trace, and no typed-in paper numbers.
    assert "paper (A10G, measured)" not in report.split("## Workloads")[1]
    # The light client waits under FCFS only: no client set is backlogged under both,
    # so the figure compares the windowed difference D, not two different client sets.
    titles = {f.title for f in figures}
    assert "light: service difference over time" in titles
    html = light_experiment.report_html.read_text()
    assert html.count("<figure>") == len(figures)
