"""Fairness metrics on small hand-made runs whose answers are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenfair.fairness.metrics import (
    accumulated_service_difference,
    backlog_fractions,
    diff_stats,
    jain_index,
    request_counts,
    service_difference,
    throughput,
    ttft_percentiles,
)
from tokenfair.fairness.report import fairness_report
from tokenfair.fairness.spans import (
    backlogged_time,
    service_spans,
    tick_times,
    tick_windows,
)
from tokenfair.measured import read_artifact_results, read_measured_reference
from tokenfair.results import ResultRecord


def served(rid, client, arrival, inp, out, first, finish, scheduled=None):
    return ResultRecord(
        rid, client, arrival, inp, out, scheduled, first, finish, "finished", "stop"
    )


def rejected(rid, client, arrival, inp):
    return ResultRecord(rid, client, arrival, inp, 0, None, None, arrival, "finished", "rejected")


# The worked example. duration T = 50, warmup = 10, window w = 20, so the ticks are
# x_i = (50 - 10) / 20 * i = 2i (i = 1..19) and the windows [x - 10 + 10, x + 10 + 10]
# = [2i, 2i + 20]. Service s = input + 2 * output:
#   a: arrives 5, s = 100 + 2*450 = 1000 spread over [10, 60] -> 20 tokens/s
#   b: arrives 5, s = 100 + 2*200 =  500 spread over [10, 60] -> 10 tokens/s
#   c: arrives 30, s = 20 + 2*40  =  100 spread over [30, 40] -> 10 tokens/s
# Service rates y = (service in window) / 20:
#   a: 2i + 10 for i <= 4 (the window starts before 10), then 20; b: half of a
#   c: overlap([2i, 2i+20], [30, 40]) * 10 / 20 = 0 (i<=5), 1, 2, 3, 4 (i=6..9),
#      5 (i=10..15, fully inside), 4, 3, 2, 1 (i=16..19)
# Demand rates r: a, b arrive at 5, inside the window only for i = 1, 2 -> 50 and 25;
#   c arrives at 30, inside for 5 <= i <= 15 -> 100 / 20 = 5.
# D = sum_j min(max y - y_j, |r_j - y_j|), max y = y_a:
#   i=1: b min(6, 19) = 6                         -> 6
#   i=2: b min(7, 18) = 7                         -> 7
#   i=3,4: b min(8, 8), min(9, 9)                 -> 8, 9
#   i=5: b 10 + c min(20, |5 - 0|) = 5            -> 15
#   i=6..9: b 10 + c |5 - y_c| = 4, 3, 2, 1       -> 14, 13, 12, 11
#   i=10..15: b 10 + c min(15, 0) = 0             -> 10 (c got all it asked for)
#   i=16..19: b 10 + c min(20 - y_c, y_c) = y_c   -> 14, 13, 12, 11
EXPECTED_D = [6, 7, 8, 9, 15, 14, 13, 12, 11, 10, 10, 10, 10, 10, 10, 14, 13, 12, 11]
# sum = 205, sum of squares = 2315 -> mean 205/19, population variance
# (19 * 2315 - 205^2) / 19^2 = 1960 / 361.
PARAMS = {"duration_s": 50.0, "warmup_s": 10.0, "window_s": 20.0}


def worked_example() -> list[ResultRecord]:
    return [
        served("a1", "a", 5.0, 100, 450, 10.0, 60.0),
        served("b1", "b", 5.0, 100, 200, 10.0, 60.0),
        served("c1", "c", 30.0, 20, 40, 30.0, 40.0),
    ]


def test_ticks_and_windows_follow_the_artifact() -> None:
    ticks = tick_times(600.0, 30.0)
    assert len(ticks) == 19
    assert ticks[0] == pytest.approx(28.5)
    assert ticks[-1] == pytest.approx(541.5)
    lo, hi = tick_windows(ticks, 60.0, 30.0)
    assert (lo[0], hi[0]) == pytest.approx((28.5, 88.5))


def test_service_rates_by_hand() -> None:
    report = fairness_report(worked_example(), **PARAMS)
    assert report.ticks == pytest.approx([2.0 * i for i in range(1, 20)])
    y = report.service_rate
    assert y["a"] == pytest.approx([12, 14, 16, 18] + [20] * 15)
    assert y["b"] == pytest.approx([6, 7, 8, 9] + [10] * 15)
    assert y["c"] == pytest.approx([0] * 5 + [1, 2, 3, 4] + [5] * 6 + [4, 3, 2, 1])
    r = report.demand_rate
    assert r["a"] == pytest.approx([50, 50] + [0] * 17)
    assert r["b"] == pytest.approx([25, 25] + [0] * 17)
    assert r["c"] == pytest.approx([0] * 4 + [5] * 11 + [0] * 4)


def test_service_difference_and_stats_by_hand() -> None:
    report = fairness_report(worked_example(), **PARAMS)
    assert report.service_diff == pytest.approx(EXPECTED_D)
    assert report.max_diff == pytest.approx(15.0)
    assert report.avg_diff == pytest.approx(205 / 19)
    assert report.diff_var == pytest.approx(1960 / 361)
    # tokens of served requests (550 + 300 + 60) / (last finish 60 - first arrival 5)
    assert report.throughput_tok_s == pytest.approx(910 / 55)


def test_rejected_and_aborted_requests_add_nothing() -> None:
    extra = [
        rejected("c2", "c", 20.0, 500),
        # aborted while waiting: never got a first token
        ResultRecord("a2", "a", 45.0, 300, 0, None, None, 50.0, "finished", "abort"),
    ]
    base = fairness_report(worked_example(), **PARAMS)
    report = fairness_report(worked_example() + extra, **PARAMS)
    assert report.service_diff == pytest.approx(base.service_diff)
    assert report.throughput_tok_s == pytest.approx(base.throughput_tok_s)
    for key in ("service_rate", "demand_rate"):
        assert getattr(report, key).keys() == getattr(base, key).keys()
        for client, curve in getattr(base, key).items():
            assert getattr(report, key)[client] == pytest.approx(curve)
    assert report.clients["c"].requests.rejected == 1
    assert report.clients["a"].requests.abort == 1
    assert report.num_requests == 5
    assert report.num_served == 3


def test_client_that_got_what_it_asked_for_is_not_unfair() -> None:
    # y = (10, 4, 1), r = (30, 4, 8): a is the max (0), b got exactly its demand
    # (min(6, 0) = 0), c is short: min(10 - 1, 8 - 1) = 7.
    service = {"a": [10.0, 6.0], "b": [4.0, 6.0], "c": [1.0, 0.0]}
    demand = {"a": [30.0, 6.0], "b": [4.0, 20.0], "c": [8.0, 0.0]}
    # tick 2: a and b tie at the max (0 each); c asked for nothing (min(6, 0) = 0).
    assert service_difference(service, demand) == pytest.approx([7.0, 0.0])


def test_weighted_service_difference() -> None:
    # Weight 2 for a halves its rates: y = (5, 4, 1), r = (15, 4, 8):
    # a 0, b min(1, 0) = 0, c min(4, 7) = 4.
    service = {"a": [10.0], "b": [4.0], "c": [1.0]}
    demand = {"a": [30.0], "b": [4.0], "c": [8.0]}
    assert service_difference(service, demand, {"a": 2.0}) == pytest.approx([4.0])


def test_diff_stats() -> None:
    stats = diff_stats([7.0, 0.0, 3.0])
    # mean 10/3; variance (49 + 0 + 9)/3 - (10/3)^2 = 58/3 - 100/9 = 74/9
    assert stats == pytest.approx({"max_diff": 7.0, "avg_diff": 10 / 3, "diff_var": 74 / 9})
    assert diff_stats([]) == {"max_diff": 0.0, "avg_diff": 0.0, "diff_var": 0.0}


def test_service_spread_and_point_mass() -> None:
    spans = service_spans(
        [served("x", "a", 0.0, 10, 20, 10.0, 20.0), served("y", "b", 0.0, 1, 1, 12.0, 12.0)]
    )
    a, b = spans["a"], spans["b"]
    # s = 10 + 40 = 50 over [10, 20]: half of it falls in [15, 25].
    assert a.service_between(np.array([15.0, 0.0, 20.0]), np.array([25.0, 100.0, 30.0])) == (
        pytest.approx([25.0, 50.0, 0.0])
    )
    # One output token finishing with its first token: all 3 tokens at t = 12, counted
    # in the half-open window that holds the instant, never in two adjacent ones.
    assert b.service_between(np.array([10.0, 12.0]), np.array([12.0, 14.0])) == (
        pytest.approx([0.0, 3.0])
    )


def test_demand_window_is_closed() -> None:
    spans = service_spans([served("x", "a", 10.0, 1, 1, 11.0, 12.0)])
    assert spans["a"].demand_between(np.array([0.0, 10.0]), np.array([10.0, 20.0])) == (
        pytest.approx([3.0, 3.0])
    )


def test_accumulated_service_difference_by_hand() -> None:
    # A_j(x) = service in [warmup, x + warmup] = [10, 2i + 10].
    # i=5 (x = 10): a 20*10 = 200, b 100, c 0 -> 200.
    # i=19 (x = 38): a 20*38 = 760, b 380, c all of its 100 -> 660.
    report = fairness_report(worked_example(), **PARAMS)
    acc = report.acc_service_diff
    assert acc[4] == pytest.approx(200.0)
    assert acc[18] == pytest.approx(660.0)
    only_ab = accumulated_service_difference({"a": [760.0], "b": [380.0], "c": [100.0]}, ["a", "b"])
    assert only_ab == pytest.approx([380.0])
    weighted = accumulated_service_difference({"a": [760.0], "b": [380.0]}, None, {"a": 2.0})
    assert weighted == pytest.approx([0.0])


def test_backlog_and_jain_by_hand() -> None:
    # Each of x, y, z has one request waiting from 0 to 50 (admitted at 50), so all three
    # are backlogged for all of [warmup 10, T 50]. In [10, 50] they receive 400, 400, 100
    # (spread over [10, 50]); the waiting requests are served after 50, outside.
    records = []
    for client, (inp, out) in {"x": (200, 100), "y": (200, 100), "z": (50, 25)}.items():
        records.append(served(f"{client}-wait", client, 0.0, 1, 1, 50.0, 60.0, scheduled=50.0))
        records.append(served(f"{client}-run", client, 0.0, inp, out, 10.0, 50.0, scheduled=0.0))
    # A light client w: a request every 4 s, each waiting 3 s for admission. It waits 75%
    # of the time but gets all it asks for: it must not count as backlogged.
    for k in range(13):
        t = 4.0 * k
        records.append(served(f"w{k}", "w", t, 1, 1, t + 3.0, t + 4.0, scheduled=t + 3.0))
    fractions = backlog_fractions(records, 10.0, 50.0)
    assert fractions == pytest.approx({"w": 0.75, "x": 1.0, "y": 1.0, "z": 1.0})
    report = fairness_report(records, **PARAMS)
    assert report.backlogged == ["x", "y", "z"]
    # (400 + 400 + 100)^2 / (3 * (400^2 + 400^2 + 100^2)) = 810000 / 990000 = 9/11
    assert report.jain_backlogged == pytest.approx(9 / 11)
    # Per tick: windows [2i, 2i + 20]; x, y, z wait throughout while the window ends by
    # 50 (i <= 15); their rates there are in the ratio 4 : 4 : 1 -> 9/11 again. For
    # i = 16 the window [32, 52] is backlogged only 18/20 = 0.9 < 0.95 of the time.
    assert report.jain_per_tick[:15] == pytest.approx([9 / 11] * 15)
    assert report.jain_per_tick[15:] == [None] * 4
    assert report.jain_per_tick_mean == pytest.approx(9 / 11)
    assert report.jain_per_tick_min == pytest.approx(9 / 11)
    # Weight 1/4 for z turns its 100 into 400: perfectly fair.
    weighted = fairness_report(records, weights={"z": 0.25}, **PARAMS)
    assert weighted.jain_backlogged == pytest.approx(1.0)
    assert weighted.clients["z"].weight == 0.25
    # Nobody waits in the worked example: no backlogged clients, no Jain index.
    plain = fairness_report(worked_example(), **PARAMS)
    assert plain.jain_backlogged is None
    assert plain.jain_per_tick_mean is None


def test_jain_index() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([2.0, 1.0]) == pytest.approx(9 / 10)
    assert jain_index([]) is None
    assert jain_index([0.0, 0.0]) == 1.0


def test_backlogged_time_is_a_union() -> None:
    # [0,5] u [3,8] u [10,12] clipped to [2, 11]: [2, 8] + [10, 11] = 7
    assert backlogged_time([(10.0, 12.0), (0.0, 5.0), (3.0, 8.0)], 2.0, 11.0) == 7.0
    assert backlogged_time([(0.0, float("inf"))], 2.0, 11.0) == 9.0


def test_throughput() -> None:
    records = [
        served("a", "a", 0.0, 10, 20, 1.0, 20.0),
        served("b", "b", 2.0, 5, 5, 3.0, 40.0),
        rejected("c", "c", 3.0, 100),
    ]
    assert throughput(records) == pytest.approx(40 / 40)
    assert throughput([]) == 0.0


def test_ttft_percentiles_and_counts() -> None:
    records = [served(f"r{i}", "a", 0.0, 1, 1, float(i), float(i) + 1) for i in range(1, 6)]
    records.append(rejected("x", "b", 1.0, 5))
    ttft = ttft_percentiles(records)
    # numpy's linear interpolation over [1, 2, 3, 4, 5]: p90 at index 3.6 -> 4.6
    assert ttft["a"] == pytest.approx({"p50": 3.0, "p90": 4.6, "p99": 4.96, "mean": 3.0})
    assert ttft["b"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert ttft["*"]["p50"] == 3.0
    counts = request_counts(records)
    assert counts["a"]["total"] == 5
    assert counts["a"]["served"] == 5
    assert counts["a"]["stop"] == 5
    assert counts["b"] == {
        "total": 1,
        "served": 0,
        "stop": 0,
        "length": 0,
        "abort": 0,
        "rejected": 1,
        "unfinished": 0,
    }


def test_report_is_json_and_has_shares() -> None:
    report = fairness_report(worked_example(), **PARAMS)
    json.dumps(report.to_json(), allow_nan=False)
    shares = {c: v.service_share for c, v in report.clients.items()}
    assert shares == pytest.approx({"a": 1000 / 1600, "b": 500 / 1600, "c": 100 / 1600})
    assert fairness_report([], **PARAMS).max_diff == 0.0


def test_duration_must_exceed_warmup() -> None:
    with pytest.raises(ValueError, match="must exceed the warm-up"):
        fairness_report(worked_example(), duration_s=10.0, warmup_s=30.0)


def test_inferred_duration_is_last_arrival_floored() -> None:
    records = [served("a", "a", 0.0, 1, 1, 1.0, 2.0), served("b", "a", 95.7, 1, 1, 96.0, 97.0)]
    report = fairness_report(records, duration_s=None, warmup_s=5.0, window_s=10.0)
    assert report.params.duration_s == 95.0 and report.params.duration_from_data


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.floats(0, 100),
            st.integers(1, 50),
            st.integers(0, 50),
            st.floats(0, 30),
            st.floats(0, 30),
        ),
        max_size=25,
    )
)
def test_difference_is_nonnegative_and_service_is_conserved(rows) -> None:
    records = [
        served(f"r{i}", c, t, inp, out, t + d1, t + d1 + d2)
        for i, (c, t, inp, out, d1, d2) in enumerate(rows)
    ]
    report = fairness_report(records, duration_s=120.0, warmup_s=10.0, window_s=20.0)
    assert all(d >= -1e-9 for d in report.service_diff)
    spans = service_spans(records)
    for client, sp in spans.items():
        total = sp.service_between(np.array([0.0]), np.array([200.0]))[0]
        assert total == pytest.approx(
            sum(r.input_tokens + 2 * r.output_tokens for r in records if r.client == client)
        )


REFERENCE = Path("/work/shared/reference/a10g_llama7b_fcfs_arena_measured.jsonl")


@pytest.mark.skipif(not REFERENCE.exists(), reason="shared reference results not present")
def test_paper_fcfs_row_from_the_measured_reference() -> None:
    # SPEC section 7: FCFS on the real trace: 759.97 / 433.53 / 32112.00 / 777 tok/s.
    report = fairness_report(read_measured_reference(REFERENCE))
    assert round(report.max_diff, 2) == 759.97
    assert round(report.avg_diff, 2) == 433.53
    assert round(report.diff_var, 2) == 32112.00
    assert round(report.throughput_tok_s) == 777


def test_artifact_results_reader(tmp_path: Path) -> None:
    responses = [
        {"adapter_dir": "c0", "prompt_len": 10, "output_len": 5, "req_time": 1.0,
         "first_token_latency": 0.5, "request_latency": 2.0},
        {"adapter_dir": "c1", "prompt_len": 7, "output_len": 9, "req_time": 2.0,
         "first_token_latency": -1, "request_latency": -1},
    ]  # fmt: skip
    path = tmp_path / "all_results_real.jsonl"
    path.write_text(json.dumps({"config": {}, "result": {"responses": responses}}) + "\n")
    first, second = read_artifact_results(path)
    assert (first.client, first.first_token_s, first.finish_s) == ("c0", 1.5, 3.0)
    assert second.finish_reason == "rejected"
    assert second.output_tokens == 0
    assert not second.served
