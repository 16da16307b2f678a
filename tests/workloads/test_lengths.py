"""Length distributions: ranges, means, validation."""

from __future__ import annotations

import numpy as np
import pytest

from tokenfair.workloads.lengths import Empirical, Fixed, LogNormal, UniformInt, fixed


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_fixed() -> None:
    assert Fixed(256).sample(rng(), 3).tolist() == [256, 256, 256]
    pair = fixed(512, 32).sample(rng(), 2)
    assert pair[0].tolist() == [512, 512]
    assert pair[1].tolist() == [32, 32]


def test_uniform_int_is_inclusive() -> None:
    values = UniformInt(3, 5).sample(rng(), 3000)
    assert set(values.tolist()) == {3, 4, 5}
    assert UniformInt(3, 5).mean() == 4.0


def test_lognormal_median_and_clipping() -> None:
    dist = LogNormal(median=100.0, sigma=1.0, low=10, high=500)
    values = dist.sample(rng(), 50_000)
    assert values.min() >= 10
    assert values.max() <= 500
    assert np.median(values) == pytest.approx(100, rel=0.05)
    assert values.dtype == np.int64
    assert LogNormal(100.0, 0.0).sample(rng(), 2).tolist() == [100, 100]


def test_empirical() -> None:
    values = Empirical((1, 2, 3)).sample(rng(), 1000)
    assert set(values.tolist()) == {1, 2, 3}
    assert Empirical((1, 3)).mean() == 2.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fixed(0),
        lambda: Fixed(True),
        lambda: UniformInt(5, 3),
        lambda: LogNormal(0.0, 1.0),
        lambda: LogNormal(10.0, -1.0),
        lambda: LogNormal(10.0, 1.0, low=5, high=4),
        lambda: Empirical(()),
        lambda: Empirical((1, 0)),
    ],
)
def test_invalid(make) -> None:
    with pytest.raises(ValueError):
        make()
