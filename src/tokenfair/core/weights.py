"""The range a VTC weight may take, checked wherever a weight enters: the tenants file,
the admin API of the server and the gateway, the simulator's weights files, the vLLM
plugin's settings, the policies' settings.

Weights are relative (only their ratios matter), so a range bounds the ratio between
the heaviest and the lightest node: 10,000 from end to end, more than any share an
operator means (a tenant with a ten-thousandth of another's share is best effort; the
gateway's priority bands say that outright). Bounded, a charge (service / weight) is
between 1/100 and 100 times the service it prices, so no weight can make a counter
overflow, or race so far ahead that the others' charges stop registering once they are
lifted to it (docs/fairness.md, "Weights and counters", has the numbers).
"""

from __future__ import annotations

import math

MIN_WEIGHT = 0.01
MAX_WEIGHT = 100.0
WEIGHT_RANGE = "from 0.01 to 100 (weights are relative: scale them to fit)"


def weight_problem(value: object) -> str | None:
    """What is wrong with `value` as a weight, or None: it must be a number (not a
    boolean), finite, from MIN_WEIGHT to MAX_WEIGHT."""
    if isinstance(value, bool):
        return f"must be a number {WEIGHT_RANGE}, not a boolean"
    if not isinstance(value, int | float):
        return f"must be a number {WEIGHT_RANGE}, got {value!r}"
    if not (math.isfinite(value) and MIN_WEIGHT <= value <= MAX_WEIGHT):
        return f"must be a number {WEIGHT_RANGE}, got {value!r}"
    return None


def check_weight(value: object, what: str = "weight") -> float:
    """`value` as a float, or ValueError ("`what` must be a number from ...")."""
    problem = weight_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return float(value)  # type: ignore[arg-type]
