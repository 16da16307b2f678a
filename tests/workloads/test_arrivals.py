"""Arrival processes: rates, spacing, on/off, phases, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfair.workloads.arrivals import Gamma, LinearRamp, OnOff, Phases, Poisson, Uniform


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_uniform_fixed_interval_with_random_phase() -> None:
    times = Uniform(2.0).times(rng(), 0.0, 100.0)
    assert np.allclose(np.diff(times), 0.5)
    assert 0.0 <= times[0] < 0.5
    assert times[-1] < 100.0
    assert len(times) == 200  # phase + k/2 < 100 for k = 0..199
    other = Uniform(2.0).times(rng(1), 0.0, 100.0)
    assert times[0] != other[0]  # the phase comes from the seed


def test_uniform_respects_start() -> None:
    times = Uniform(1.0).times(rng(), 50.0, 60.0)
    assert 50.0 <= times[0] < 51.0
    assert len(times) == 10


@pytest.mark.parametrize("process", [Poisson(5.0), Gamma(5.0, 1.0), Gamma(5.0, 3.0)])
def test_renewal_processes_have_the_right_mean_rate(process) -> None:
    times = process.times(rng(), 0.0, 2000.0)
    assert len(times) / 2000.0 == pytest.approx(5.0, rel=0.1)
    assert np.all(np.diff(times) >= 0)
    assert times[0] >= 0.0
    assert times[-1] < 2000.0


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_coefficient_of_variation(cv: float) -> None:
    gaps = np.diff(Gamma(10.0, cv).times(rng(), 0.0, 5000.0))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)


def test_poisson_gaps_are_exponential() -> None:
    gaps = np.diff(Poisson(4.0).times(rng(), 0.0, 5000.0))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_linear_ramp_count_and_rates() -> None:
    # Expected count = (0.2 + 2) / 2 * 600 = 660.
    times = LinearRamp(0.2, 2.0).times(rng(), 0.0, 600.0)
    assert abs(len(times) - 660) <= 1
    # Rate near the start ~0.2 (+ 0.3 by t = 100), near the end ~2.
    early = np.sum(times < 100.0) / 100.0
    late = np.sum(times >= 500.0) / 100.0
    assert early == pytest.approx(0.35, abs=0.05)
    assert late == pytest.approx(1.85, abs=0.05)
    assert np.all(np.diff(times) > 0)


def test_linear_ramp_constant_and_decreasing() -> None:
    flat = LinearRamp(1.0, 1.0).times(rng(), 0.0, 100.0)
    assert np.allclose(np.diff(flat), 1.0)
    falling = LinearRamp(2.0, 0.0).times(rng(), 0.0, 100.0)
    assert abs(len(falling) - 100) <= 1
    assert np.sum(falling < 50) > 2 * np.sum(falling >= 50)


def test_linear_ramp_poisson() -> None:
    counts = [len(LinearRamp(0.2, 2.0, poisson=True).times(rng(s), 0.0, 600.0)) for s in range(5)]
    assert np.mean(counts) == pytest.approx(660, rel=0.08)


def test_on_off_keeps_only_on_periods() -> None:
    times = OnOff(Uniform(2.0), 60.0).times(rng(), 0.0, 600.0)
    periods = np.floor(times / 60.0).astype(int)
    assert set(periods.tolist()) == {0, 2, 4, 6, 8}
    assert len(times) == 600
    off_first = OnOff(Uniform(2.0), 60.0, start_on=False).times(rng(), 0.0, 600.0)
    assert set(np.floor(off_first / 60.0).astype(int).tolist()) == {1, 3, 5, 7, 9}


def test_phases_run_back_to_back() -> None:
    process = Phases(((100.0, Uniform(1.0)), (50.0, None), (100.0, Uniform(3.0))))
    times = process.times(rng(), 0.0, process.length_s)
    assert process.length_s == 250.0
    assert np.sum(times < 100) == 100
    assert np.sum((times >= 100) & (times < 150)) == 0
    assert np.sum(times >= 150) == 300
    assert np.all(np.diff(times) >= 0)


def test_deterministic_for_a_seed() -> None:
    a = Poisson(3.0).times(rng(7), 0.0, 100.0)
    b = Poisson(3.0).times(rng(7), 0.0, 100.0)
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Uniform(0.0),
        lambda: Poisson(-1.0),
        lambda: Gamma(1.0, 0.0),
        lambda: LinearRamp(0.0, 0.0),
        lambda: LinearRamp(-1.0, 1.0),
        lambda: OnOff(Uniform(1.0), 0.0),
        lambda: Phases(((0.0, Uniform(1.0)),)),
    ],
)
def test_invalid_parameters(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_empty_interval() -> None:
    assert len(Poisson(1.0).times(rng(), 5.0, 5.0)) == 0
    assert len(Uniform(1.0).times(rng(), 5.0, 5.0)) == 0
    assert len(LinearRamp(1.0, 2.0).times(rng(), 5.0, 5.0)) == 0
