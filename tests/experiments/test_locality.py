"""The locality experiment: clients sharing prompt prefixes, and the fluid ideal."""

from __future__ import annotations

import json

import pytest

from tokenfair.experiments.locality import light_clients, run_locality_experiment
from tokenfair.fairness.fluid import compare_with_fluid, fluid_service_spans
from tokenfair.report.locality_report import write_locality_report
from tokenfair.results import ResultRecord

from .test_experiment import assert_png


@pytest.fixture(scope="module")
def system_prompt_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("locality")
    result = run_locality_experiment(
        out, seeds=[0], policies=["vtc", "dlpm"], pools={"system-prompt": 3072}, workers=1
    )
    return out, result


def test_dlpm_serves_more_from_the_cache_than_vtc_on_competing_system_prompts(
    system_prompt_runs,
):
    _, result = system_prompt_runs
    vtc, dlpm = result.row("system-prompt", "vtc"), result.row("system-prompt", "dlpm")
    assert dlpm.prefix_hit_rate > vtc.prefix_hit_rate + 0.1
    assert dlpm.throughput_tok_s > 1.2 * vtc.throughput_tok_s
    for row in (vtc, dlpm):
        # A real run is never fairer than the ideal at its own capacity, and never far.
        assert row.fluid_max_diff <= row.max_diff <= 2 * row.fluid_max_diff
        assert row.light_ttft_p90_s is not None


def test_the_locality_report_has_its_table_figure_and_metrics(system_prompt_runs):
    out, result = system_prompt_runs
    report = write_locality_report(result, out)
    text = report.read_text()
    assert "Fair and cache-efficient" in text and "| dlpm |" in text
    assert_png(out / "figures" / "locality.png")
    rows = json.loads((out / "metrics.json").read_text())["rows"]
    assert {r["policy"] for r in rows} == {"vtc", "dlpm"}


def record(client: str, arrival: float, first: float, finish: float, tokens: int = 10):
    return ResultRecord(
        request_id=f"{client}-{arrival}",
        client=client,
        arrival_s=arrival,
        input_tokens=tokens,
        output_tokens=0,
        first_token_s=first,
        finish_s=finish,
    )


def test_the_fluid_ideal_shares_the_runs_capacity_equally_among_busy_clients():
    # One client is served first and alone, then the other, each for 10 s, at 10
    # tokens/s: the ideal serves both at 5/s throughout the same 20 s.
    records = [record("a", 0.0, 0.0, float(i + 1)) for i in range(10)]
    records += [record("b", 0.0, float(10 + i), float(11 + i)) for i in range(10)]
    fluid = fluid_service_spans(records)
    for client in ("a", "b"):
        spans = fluid[client]
        assert spans.service_between([0.0], [10.0])[0] == pytest.approx(50.0)
        assert spans.service_between([0.0], [20.0])[0] == pytest.approx(100.0)
    unfair = compare_with_fluid(records, duration_s=20.0, window_s=4.0, warmup_s=0.0)
    assert unfair.max_shortfall > 40  # b was 50 tokens behind at t = 10
    fair = [record(c, 0.0, float(i), float(i + 1), 5) for i in range(20) for c in "ab"]
    balanced = compare_with_fluid(fair, duration_s=20.0, window_s=4.0, warmup_s=0.0)
    assert balanced.max_shortfall < 6


def test_light_clients_send_fewer_requests_than_average():
    records = [record("heavy", float(i), float(i), float(i) + 1) for i in range(8)]
    records += [record("light", 0.0, 0.0, 1.0), record("mid", 0.0, 0.0, 1.0)] * 2
    assert light_clients(records) == {"light", "mid"}
