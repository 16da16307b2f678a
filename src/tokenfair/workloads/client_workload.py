"""One client of a synthetic workload: when its requests come, how long they are, its weight."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenfair.workloads.arrivals import ArrivalProcess
from tokenfair.workloads.lengths import ClientLengths
from tokenfair.workloads.prefixes import RequestDraw


@dataclass(frozen=True, slots=True)
class ClientWorkload:
    """One client of a workload: when its requests come, how long they are, its weight."""

    client: str
    arrivals: ArrivalProcess
    lengths: ClientLengths
    weight: float = 1.0

    def draw(self, rng: np.random.Generator, duration_s: float) -> list[RequestDraw]:
        times = self.arrivals.times(rng, 0.0, duration_s)
        inputs, outputs = self.lengths.sample(rng, len(times))
        return [
            RequestDraw(float(t), int(i), int(o))
            for t, i, o in zip(times, inputs, outputs, strict=True)
        ]
