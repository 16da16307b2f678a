"""Any mix of tenants: the experiment's rows on one short mix, the share arithmetic on a
hand-computed case, and the figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenfair.experiments.mixes import (
    ALONE,
    DEFAULT,
    FCFS,
    RUNS,
    demand_shares,
    heavy_throughput,
    mix_jobs,
    mix_rows,
    summary,
)
from tokenfair.experiments.runner import run_jobs
from tokenfair.experiments.workloads import Workload
from tokenfair.fairness.curves import service_in_interval
from tokenfair.report.mixes_report import plot_any_mix
from tokenfair.results import ResultRecord
from tokenfair.workloads.mixes import random_mix
from tokenfair.workloads.trace import TraceRecord

SEED, SHORT_S = 4, 30.0


@pytest.fixture(scope="module")
def outcomes():
    return run_jobs(mix_jobs([SEED], ["a10g"], duration_s=SHORT_S), workers=1)


def test_every_mix_runs_each_policy_and_each_light_tenant_alone(outcomes):
    light = [t.name for t in random_mix(SEED).spec.light]
    variants = {o.job.variant for o in outcomes}
    assert variants == {f"a10g|{SEED}|{label}" for label, _, _ in RUNS} | {
        f"a10g|{SEED}|{ALONE}|{name}" for name in light
    }
    for o in outcomes:
        assert max(r.arrival_s for r in o.workload.records) < SHORT_S
        if ALONE in o.job.variant:
            assert {r.client for r in o.results} == {o.job.variant.rsplit("|", 1)[1]}


def test_the_rows_fields_ratios_and_shares(outcomes):
    lights, mixes = mix_rows(outcomes)
    spec = random_mix(SEED).until(SHORT_S).spec
    assert [row.tenant for row in lights] == [t.name for t in spec.light]
    (mix,) = mixes
    assert mix.spec == spec.describe() and mix.heavy_x_fcfs[FCFS] == 1.0
    assert set(mix.heavy_tok_s) == {label for label, _, _ in RUNS}
    fcfs = next(o for o in outcomes if o.job.variant.endswith(FCFS))
    served = sum(service_in_interval(fcfs.results, 0.0, SHORT_S).values())
    total_weight = sum(t.weight for t in spec.tenants)
    for row in lights:
        assert row.share == pytest.approx(row.weight / total_weight * served)
        assert row.demand_share == pytest.approx(row.demand / row.share)
        assert set(row.runs) == {label for label, _, _ in RUNS}
        for figures in row.runs.values():
            assert figures.ttft_p99_x_alone == pytest.approx(
                figures.ttft_p99_s / row.alone.ttft_p99_s
            )
            assert figures.tpot_p50_x_alone == pytest.approx(
                figures.tpot_p50_s / row.alone.tpot_p50_s
            )
    figures = summary(lights, mixes)["a10g"]
    assert figures["mixes"] == 1 and set(figures["runs"]) == {label for label, _, _ in RUNS}
    default = figures["runs"][DEFAULT]
    assert default["noticed"]["light_tenants"] == len(lights)
    assert default["under_90"]["tenants"] == sum(r.demand_share < 0.9 for r in lights)


def test_demand_as_a_share_of_the_weighted_share_by_hand():
    def trace(i: int, client: str, arrival: float, prompt: int, output: int) -> TraceRecord:
        return TraceRecord(arrival, client, prompt, output, f"r{i}")

    records = (
        trace(0, "heavy-0", 0.0, 1000, 100),
        trace(1, "light-0", 0.5, 100, 50),
        trace(2, "light-0", 8.0, 200, 25),
    )
    workload = Workload("hand", records, 10.0, weights={"heavy-0": 3.0, "light-0": 1.0})
    served = [  # what fcfs did: service spread over [first token, finish]
        ResultRecord("r0", "heavy-0", 0.0, 1000, 100, 0.0, 2.0, 12.0),  # 1200, 8/10 in [0, 10]
        ResultRecord("r1", "light-0", 0.5, 100, 50, 0.5, 1.0, 3.0),  # 200, all of it
        ResultRecord("r2", "light-0", 8.0, 200, 25, 8.0, 9.0, 11.0),  # 250, half of it
    ]
    shares = demand_shares(workload, served)
    capacity = 960 + 200 + 125
    # light-0 asks 100 + 2 x 50 + 200 + 2 x 25 = 450 against a quarter of the capacity.
    assert shares["light-0"] == pytest.approx((450.0, capacity / 4))
    assert shares["light-0"][0] / shares["light-0"][1] == pytest.approx(1.4008, abs=1e-4)
    assert shares["heavy-0"] == pytest.approx((1200.0, capacity * 3 / 4))
    # The heavy tenant's 1,100 tokens from the first arrival (0 s) to its finish (12 s).
    assert heavy_throughput(served) == pytest.approx(1100 / 12)


def test_the_figure(outcomes, tmp_path: Path):
    lights, _ = mix_rows(outcomes)
    path = tmp_path / "figures" / "any_mix.png"
    plot_any_mix(lights, path)
    assert path.stat().st_size > 0
