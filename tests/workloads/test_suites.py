"""The paper's suites (SPEC section 7): client rates, lengths, durations, determinism."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from tokenfair.workloads.suites import (
    SUITES,
    generate_suite,
    suite_descriptions,
)
from tokenfair.workloads.trace import read_trace, write_trace


def per_client(suite):
    groups = defaultdict(list)
    for rec in suite.records:
        groups[rec.client].append(rec)
    return groups


def count_in(records, lo, hi):
    return sum(lo <= r.arrival_s < hi for r in records)


# name -> (duration, per-client expected counts over the whole run, (input, output))
UNIFORM_SUITES = {
    "overload": (360, [540, 1080], (256, 256)),
    "proportional": (600, [150, 300, 900], (256, 256)),
    "on_off_less": (600, [150, 1200], (256, 256)),  # client-0 on half the time
    "on_off_overload": (600, [600, 1800], (256, 256)),
    "increase": (600, [300, 660], (256, 256)),  # (0.2 + 2) / 2 * 600 = 660
    "dist_shift": (900, [90 + 300 + 150, 600 + 300 + 450], (256, 256)),
    "overload-multi": (360, [144] * 3 + [216] * 5, (256, 256)),
    "overload-weighted": (360, [288, 288, 432, 576], (256, 256)),
}


@pytest.mark.parametrize("name", list(UNIFORM_SUITES))
def test_uniform_suite_counts_and_lengths(name: str) -> None:
    duration, counts, (inp, out) = UNIFORM_SUITES[name]
    suite = generate_suite(name, seed=0)
    assert suite.duration_s == duration
    assert suite.name == name
    groups = per_client(suite)
    assert sorted(groups) == [f"client-{i}" for i in range(len(counts))]
    for i, expected in enumerate(counts):
        assert abs(len(groups[f"client-{i}"]) - expected) <= 1
    assert {(r.input_tokens, r.output_tokens) for r in suite.records} == {(inp, out)}
    assert all(0 <= r.arrival_s < duration for r in suite.records)


def test_records_are_sorted_with_unique_ids() -> None:
    suite = generate_suite("overload-multi")
    arrivals = [r.arrival_s for r in suite.records]
    assert arrivals == sorted(arrivals)
    assert [r.request_id for r in suite.records] == [f"r{i}" for i in range(len(arrivals))]


def test_uniform_clients_have_fixed_spacing() -> None:
    groups = per_client(generate_suite("overload"))
    gaps0 = np.diff([r.arrival_s for r in groups["client-0"]])
    gaps1 = np.diff([r.arrival_s for r in groups["client-1"]])
    assert np.allclose(gaps0, 1 / 1.5, atol=2e-6)
    assert np.allclose(gaps1, 1 / 3, atol=2e-6)


def test_on_off_client_only_arrives_while_on() -> None:
    for name in ("on_off_less", "on_off_overload"):
        groups = per_client(generate_suite(name))
        periods = {int(r.arrival_s // 60) for r in groups["client-0"]}
        assert periods == {0, 2, 4, 6, 8}
        assert {int(r.arrival_s // 60) for r in groups["client-1"]} == set(range(10))


def test_dist_shift_phases() -> None:
    groups = per_client(generate_suite("dist_shift"))
    a, b = groups["client-0"], groups["client-1"]
    # phase 1: client-0 0.5 req/s on/off (on 180 of 300 s: 90), client-1 2 req/s (600)
    assert abs(count_in(a, 0, 300) - 90) <= 1
    assert {int(r.arrival_s // 60) for r in a if r.arrival_s < 300} == {0, 2, 4}
    assert abs(count_in(b, 0, 300) - 600) <= 1
    # phase 2: 1 and 1; phase 3: 0.5 and 1.5
    assert abs(count_in(a, 300, 600) - 300) <= 1
    assert abs(count_in(b, 300, 600) - 300) <= 1
    assert abs(count_in(a, 600, 900) - 150) <= 1
    assert abs(count_in(b, 600, 900) - 450) <= 1


def test_increase_client_rate_rises() -> None:
    groups = per_client(generate_suite("increase"))
    ramp = groups["client-1"]
    # rate(t) = 0.2 + 1.8 t / 600: first 60 s expect 0.2*60 + 0.9*60^2/600 = 17.4
    assert count_in(ramp, 0, 60) == pytest.approx(17.4, abs=1.5)
    # last 60 s: 660 - [0.2*540 + 0.0015*540^2] = 660 - 545.4 = 114.6
    assert count_in(ramp, 540, 600) == pytest.approx(114.6, abs=1.5)


@pytest.mark.parametrize(
    ("name", "short", "long"),
    [
        ("poisson_short_long", (64, 64), (256, 256)),
        ("poisson_short_long_2", (512, 32), (32, 512)),
    ],
)
def test_poisson_short_long(name: str, short: tuple[int, int], long: tuple[int, int]) -> None:
    suite = generate_suite(name)
    assert suite.duration_s == 600
    groups = per_client(suite)
    a, b = groups["client-0"], groups["client-1"]
    assert len(a) / 600 == pytest.approx(8.0, rel=0.05)
    assert len(b) / 600 == pytest.approx(1.5, rel=0.12)
    assert {(r.input_tokens, r.output_tokens) for r in a} == {short}
    assert {(r.input_tokens, r.output_tokens) for r in b} == {long}
    gaps = np.diff([r.arrival_s for r in a])
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # Poisson


def test_weighted_suite_yields_weights() -> None:
    suite = generate_suite("overload-weighted")
    assert suite.weights == {"client-0": 1.0, "client-1": 2.0, "client-2": 3.0, "client-3": 4.0}
    assert generate_suite("overload").weights is None


def test_arena_x10_is_arena_like() -> None:
    suite = generate_suite("arena-x10")
    assert suite.duration_s == 6000
    assert len(suite.records) == pytest.approx(15_000, rel=0.03)
    counts = Counter(r.client for r in suite.records)
    assert len(counts) == 27
    ranked = [counts[f"client-{i}"] for i in range(27)]
    assert ranked[0] > 5 * ranked[-1]  # skewed popularity
    inputs = np.array([r.input_tokens for r in suite.records])
    outputs = np.array([r.output_tokens for r in suite.records])
    assert inputs.mean() == pytest.approx(136, rel=0.1)
    assert outputs.mean() == pytest.approx(256, rel=0.1)
    assert np.median(inputs) == pytest.approx(44, rel=0.15)
    assert inputs.max() <= 1023 and outputs.max() <= 1023
    assert inputs.min() >= 1 and outputs.min() >= 1


@pytest.mark.parametrize("name", list(SUITES))
def test_deterministic_for_a_seed_and_varies_with_it(name: str) -> None:
    first = generate_suite(name, seed=3)
    assert generate_suite(name, seed=3).records == first.records
    assert generate_suite(name, seed=4).records != first.records


def test_every_suite_is_described_and_unknown_names_fail() -> None:
    descriptions = suite_descriptions()
    assert set(descriptions) == set(SUITES)
    assert all(d and "\n" not in d for d in descriptions.values())
    with pytest.raises(ValueError, match="unknown suite 'nope'; known suites: overload"):
        generate_suite("nope")


def test_suite_round_trips_through_a_trace_file(tmp_path: Path) -> None:
    suite = generate_suite("proportional", seed=1)
    path = tmp_path / "p.jsonl"
    write_trace(suite.records, path)
    assert read_trace(path) == suite.records
