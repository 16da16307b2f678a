"""The fairness-efficiency frontier sweep (benchmarks/frontier.py), on a small workload."""

from __future__ import annotations

import json

import pytest

from tokenfair.experiments.frontier import (
    CONTROL_POOL,
    FrontierCell,
    footprint_tokens,
    frontier_scenarios,
    run_frontier,
    window_throughput,
)
from tokenfair.report.frontier_report import write_frontier_report
from tokenfair.results import ResultRecord
from tokenfair.workloads.documents import DocumentsSpec

from .test_experiment import assert_png

# Three backlogged clients, two 1,000-token documents each, 90 s: a few seconds to run.
SMALL = DocumentsSpec(clients=3, documents_per_client=2, document_tokens=1000, duration_s=90.0)


def test_the_scenarios_cover_pools_variants_and_controls() -> None:
    scenarios = frontier_scenarios([0.2, 0.5], [0.0, 1.0], shared=1, base=SMALL)
    names = [(s.variant, s.pool_fraction) for s in scenarios]
    assert names[:6] == [
        ("skew 0", 0.2),
        ("skew 1", 0.2),
        ("skew 0, 1 shared", 0.2),
        ("skew 0", 0.5),
        ("skew 1", 0.5),
        ("skew 0, 1 shared", 0.5),
    ]
    assert names[6:] == [
        ("control: documents", CONTROL_POOL),
        ("control: system-prompt", CONTROL_POOL),
    ]
    shared = scenarios[2]
    workload = shared.workload(0)
    # One shared document and one own per client: 4 distinct documents of 1,000 tokens.
    assert footprint_tokens(workload) == 4000 and shared.kv_tokens(workload) == 800
    assert not frontier_scenarios([0.3], [0.0], shared=0, controls=False, base=SMALL)[0].control


@pytest.fixture(scope="module")
def cells() -> list[FrontierCell]:
    scenarios = frontier_scenarios([0.34], [0.0], shared=0, controls=False, base=SMALL)
    return run_frontier(scenarios, ["vtc", "dlpm:1e12"], seeds=[0], workers=1)


def test_cells_carry_ratios_to_vtc_in_the_same_scenario(cells: list[FrontierCell]) -> None:
    assert [c.policy for c in cells] == ["vtc", "dlpm:1e12"]
    vtc, lpf = cells
    assert vtc.kv_tokens == round(0.34 * 6000)
    assert vtc.throughput_vs_vtc == vtc.max_diff_vs_vtc == 1.0
    assert lpf.throughput_vs_vtc == pytest.approx(lpf.throughput_tok_s / vtc.throughput_tok_s)
    per = lpf.max_diff_per_throughput
    assert per == pytest.approx(lpf.max_diff / lpf.throughput_tok_s)
    assert lpf.max_diff_per_throughput_vs_vtc == pytest.approx(per / vtc.max_diff_per_throughput)
    # Longest prefix first, unbounded: the cache serves more, fairness is given up.
    assert lpf.prefix_hit_rate > vtc.prefix_hit_rate
    assert lpf.max_diff > vtc.max_diff
    assert vtc.backlogged_clients == 3 and vtc.clients == 3
    row = json.loads(json.dumps(lpf.to_json()))
    assert FrontierCell.from_json(row).policy == "dlpm:1e12"


def test_the_frontier_report_draws_the_figure(cells: list[FrontierCell], tmp_path) -> None:
    report = write_frontier_report(cells, tmp_path, {"seeds": [0]})
    text = report.read_text()
    assert "fairness-efficiency frontier" in text and "| dlpm:1e12 |" in text
    assert_png(tmp_path / "figures" / "frontier.png")
    assert (tmp_path / "report.html").exists()


def test_window_throughput_counts_the_tokens_served_inside_the_window() -> None:
    def served(first: float, finish: float) -> ResultRecord:
        return ResultRecord(
            request_id=f"r{first}",
            client="a",
            arrival_s=0.0,
            input_tokens=60,
            output_tokens=40,
            first_token_s=first,
            finish_s=finish,
        )

    # 100 tokens over [0, 10] and 100 over [10, 20]: half of each inside [5, 15].
    assert window_throughput([served(0, 10), served(10, 20)], 5.0, 15.0) == pytest.approx(10.0)
