"""Dense curves for the figures agree with the metrics they illustrate."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfair.core.cost import LinearCost
from tokenfair.fairness.bounds import ALL_SERVED, BACKLOGGED, difference_among, service_bound
from tokenfair.fairness.curves import POINTS_PER_TICK, busiest_clients, service_difference_curve
from tokenfair.fairness.report import fairness_report
from tokenfair.results import ResultRecord
from tokenfair.workloads.trace import TraceRecord


def served(rid: str, client: str, arrival: float, inp: int, out: int, first: float, finish: float):
    return ResultRecord(rid, client, arrival, inp, out, first, first, finish, "finished", "stop")


def busy_run() -> list[ResultRecord]:
    records = []
    for k in range(40):
        t = 2.5 * k
        records.append(served(f"a{k}", "a", t, 50, 40, t + 0.5, t + 3.0))
        records.append(served(f"b{k}", "b", t + 1.0, 20, 10 + k % 7, t + 1.2, t + 2.0))
        if k % 4 == 0:
            records.append(served(f"c{k}", "c", t, 5, 5, t + 4.0, t + 9.0))
    return records


def test_windowed_difference_curve_passes_through_the_metric_ticks() -> None:
    records = busy_run()
    params = {"duration_s": 100.0, "window_s": 20.0, "warmup_s": 10.0}
    report = fairness_report(records, **params)
    times, values = service_difference_curve(records, 100.0, 20.0, 10.0)
    at_ticks = values[::POINTS_PER_TICK]
    assert len(at_ticks) == 19
    assert at_ticks == pytest.approx(report.service_diff, abs=1e-9)
    assert times[::POINTS_PER_TICK] - 10.0 == pytest.approx(report.ticks)
    assert values.max() >= report.max_diff - 1e-9


def test_difference_among_names_its_scope() -> None:
    records = busy_run()
    among = difference_among(records, ["a", "b"], 100.0, 10.0)
    everyone = difference_among(records, None, 100.0, 10.0)
    assert among.scope == BACKLOGGED and everyone.scope == ALL_SERVED
    assert np.all(everyone.values >= among.values - 1e-9)  # more clients, wider spread


def test_bound_and_busiest_clients_use_the_one_cost() -> None:
    trace = [TraceRecord(0.0, "a", 300, 10, "r0")]
    assert service_bound(trace, 100, LinearCost(1.0, 2.0)) == 300
    assert service_bound(trace, 100, LinearCost(1.0, 5.0)) == 500
    records = [served("x", "x", 0, 100, 1, 1, 2), served("y", "y", 0, 1, 60, 1, 2)]
    assert busiest_clients(records, 1) == ["y"]  # 1 + 2 x 60 > 100 + 2 x 1
    assert busiest_clients(records, 1, LinearCost(1.0, 1.0)) == ["x"]
