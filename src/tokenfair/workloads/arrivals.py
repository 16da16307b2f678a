"""Arrival processes: when a client's requests arrive.

Each process is a small frozen dataclass with one method, `times(rng, start, end)`, that
returns the sorted arrival times in [start, end) as a numpy array. Randomness comes only
from the `rng` passed in, so a workload is reproducible from its seed.

- `Uniform(rate)`: one request every 1/rate seconds, starting at a random phase in
  [0, 1/rate) (the paper's "uniform" arrivals);
- `Poisson(rate)`: exponential gaps with mean 1/rate;
- `Gamma(rate, cv)`: gamma gaps with mean 1/rate and coefficient of variation cv
  (cv = 1 is Poisson; cv > 1 is burstier, cv < 1 more regular);
- `LinearRamp(start_rate, end_rate, poisson=False)`: the rate moves linearly from
  start_rate at `start` to end_rate at `end`; arrivals are uniform (or Poisson) in
  "operational time", i.e. where the expected request count crosses phase + k;
- `OnOff(inner, period_s)`: the inner process, kept only during ON periods: ON for
  period_s, OFF for period_s, ..., measured from `start` (the paper's on/off client);
- `Phases(((length_s, process), ...))`: consecutive phases, each process running over
  its own slice of time (the paper's distribution-shift workload).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class ArrivalProcess(Protocol):
    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in [start, end)."""
        ...


def _check_rate(rate: float, name: str = "rate") -> None:
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {rate}")


def _renewal(
    gaps: Callable[[int], np.ndarray], rate: float, start: float, end: float
) -> np.ndarray:
    """Cumulate gaps from `gaps(n)` from `start` until passing `end`."""
    span = end - start
    if span <= 0:
        return np.empty(0)
    out: list[np.ndarray] = []
    t = start
    # Draw in batches sized for the expected count, plus slack; rarely needs a second.
    batch = int(rate * span * 1.2) + 16
    while t < end:
        chunk = t + np.cumsum(gaps(batch))
        out.append(chunk)
        t = float(chunk[-1])
    times = np.concatenate(out)
    return times[times < end]


@dataclass(frozen=True, slots=True)
class Uniform:
    rate: float

    def __post_init__(self) -> None:
        _check_rate(self.rate)

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        interval = 1.0 / self.rate
        first = start + rng.uniform(0.0, interval)
        count = max(0, math.ceil((end - first) / interval))
        times = first + interval * np.arange(count)
        return times[times < end]


@dataclass(frozen=True, slots=True)
class Poisson:
    rate: float

    def __post_init__(self) -> None:
        _check_rate(self.rate)

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        return _renewal(lambda n: rng.exponential(1.0 / self.rate, n), self.rate, start, end)


@dataclass(frozen=True, slots=True)
class Gamma:
    rate: float
    cv: float

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        _check_rate(self.cv, "cv")

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        shape = 1.0 / (self.cv * self.cv)
        scale = 1.0 / (self.rate * shape)  # mean = shape * scale = 1 / rate
        return _renewal(lambda n: rng.gamma(shape, scale, n), self.rate, start, end)


@dataclass(frozen=True, slots=True)
class LinearRamp:
    start_rate: float
    end_rate: float
    poisson: bool = False

    def __post_init__(self) -> None:
        for name, rate in (("start_rate", self.start_rate), ("end_rate", self.end_rate)):
            if not (math.isfinite(rate) and rate >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {rate}")
        if self.start_rate == 0 and self.end_rate == 0:
            raise ValueError("LinearRamp needs a positive start_rate or end_rate")

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        span = end - start
        if span <= 0:
            return np.empty(0)
        # Expected arrivals by offset tau: L(tau) = b tau + a tau^2, with b the start rate
        # and a = (end_rate - start_rate) / (2 span). Arrivals sit where L crosses the
        # targets u: phase + k (uniform) or a unit-rate Poisson process (poisson).
        a = (self.end_rate - self.start_rate) / (2.0 * span)
        b = self.start_rate
        total = b * span + a * span * span
        if self.poisson:
            targets = _renewal(lambda n: rng.exponential(1.0, n), 1.0, 0.0, total)
        else:
            phase = rng.uniform(0.0, 1.0)
            targets = phase + np.arange(max(0, math.ceil(total - phase)))
            targets = targets[targets < total]
        # tau = (-b + sqrt(b^2 + 4 a u)) / (2a), written to stay exact when a -> 0.
        tau = 2.0 * targets / (b + np.sqrt(np.maximum(b * b + 4.0 * a * targets, 0.0)))
        times = start + tau
        return times[times < end]


@dataclass(frozen=True, slots=True)
class OnOff:
    inner: ArrivalProcess
    period_s: float
    start_on: bool = True

    def __post_init__(self) -> None:
        _check_rate(self.period_s, "period_s")

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        times = self.inner.times(rng, start, end)
        period_index = np.floor((times - start) / self.period_s).astype(np.int64)
        on = (period_index % 2 == 0) if self.start_on else (period_index % 2 == 1)
        return times[on]


@dataclass(frozen=True, slots=True)
class Phases:
    phases: tuple[tuple[float, ArrivalProcess | None], ...]  # None: silent phase

    def __post_init__(self) -> None:
        for length, _ in self.phases:
            _check_rate(length, "phase length")

    @property
    def length_s(self) -> float:
        return sum(length for length, _ in self.phases)

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        parts = []
        t = start
        for length, process in self.phases:
            stop = min(t + length, end)
            if process is not None and stop > t:
                parts.append(process.times(rng, t, stop))
            t += length
        return np.concatenate(parts) if parts else np.empty(0)
