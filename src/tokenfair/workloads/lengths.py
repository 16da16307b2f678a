"""Length distributions: how many tokens a request reads and writes.

Each distribution is a frozen dataclass with `sample(rng, n) -> np.ndarray` of n
integers >= 1. `ClientLengths` pairs an input and an output distribution for one client.

- `Fixed(value)`: always the same length (the paper's synthetic suites: 256/256);
- `UniformInt(low, high)`: uniform over low..high inclusive;
- `LogNormal(median, sigma, low, high)`: exp(N(log median, sigma)) rounded and clipped to
  [low, high]; heavy-tailed like real chat traffic;
- `Empirical(values)`: resampled with replacement from observed lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class LengthDist(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n token counts, each an integer >= 1."""
        ...

    def mean(self) -> float:
        """Expected value (before clipping, for LogNormal: see its docstring)."""
        ...


def _check_length(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class Fixed:
    value: int

    def __post_init__(self) -> None:
        _check_length("value", self.value)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def mean(self) -> float:
        return float(self.value)


@dataclass(frozen=True, slots=True)
class UniformInt:
    low: int
    high: int  # inclusive

    def __post_init__(self) -> None:
        _check_length("low", self.low)
        _check_length("high", self.high)
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, slots=True)
class LogNormal:
    """exp(N(log median, sigma^2)), rounded, clipped to [low, high].

    `mean()` is the unclipped mean median * exp(sigma^2 / 2); clipping lowers it.
    """

    median: float
    sigma: float
    low: int = 1
    high: int = 1 << 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median > 0):
            raise ValueError(f"median must be a finite number > 0, got {self.median}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma}")
        _check_length("low", self.low)
        _check_length("high", self.high)
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raw = rng.lognormal(math.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(raw), self.low, self.high).astype(np.int64)

    def mean(self) -> float:
        return self.median * math.exp(self.sigma * self.sigma / 2)


@dataclass(frozen=True, slots=True)
class Empirical:
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("Empirical needs at least one value")
        for v in self.values:
            _check_length("value", v)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)

    def mean(self) -> float:
        return sum(self.values) / len(self.values)


@dataclass(frozen=True, slots=True)
class ClientLengths:
    """The input and output length distributions of one client's requests."""

    input: LengthDist
    output: LengthDist

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.input.sample(rng, n), self.output.sample(rng, n)


def fixed(input_tokens: int, output_tokens: int) -> ClientLengths:
    """Every request reads input_tokens and writes output_tokens."""
    return ClientLengths(Fixed(input_tokens), Fixed(output_tokens))
