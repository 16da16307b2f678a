"""A policy of one's own over a grid of its arguments (`--sweep`), summed up: each
point's headline figures against the arguments it was given, per workload.

`mypkg.fair:DecayVTC(half_life_s=[10, 30, 120], floor=[0, 0.5])` runs six points,
`DecayVTC(half_life_s=10, floor=0)` and so on (core/policies/loading.py: `sweep_specs`);
the experiment runs them beside its other policies, and `sweep_summary` gathers their
rows for the report's table and figure and metrics.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenfair.core.policies.loading import parse_spec, sweep_specs
from tokenfair.experiments.runner import RunOutcome


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One point of the sweep on one workload."""

    workload: str
    policy: str  # the point's spec
    label: str
    arguments: dict[str, Any]  # the swept arguments' values at this point
    max_diff: float
    avg_diff: float
    throughput_tok_s: float


@dataclass(slots=True)
class SweepSummary:
    spec: str  # as given, with its lists
    varied: dict[str, list[Any]]  # each argument given as a list, and its values
    points: list[str]
    rows: list[SweepRow] = field(default_factory=list)


def sweep_points(spec: str | None) -> list[str]:
    """The specs a sweep runs (none without one); PolicyError for a bad sweep."""
    return sweep_specs(spec) if spec else []


def sweep_summary(spec: str, outcomes: Sequence[RunOutcome]) -> SweepSummary:
    """The sweep's rows among `outcomes` (their unvaried runs), in the order run; a
    point that failed has none."""
    varied = {k: v for k, v in parse_spec(spec).arguments.items() if isinstance(v, list)}
    points = sweep_points(spec)
    rows = [
        SweepRow(
            workload=o.workload.name,
            policy=o.policy,
            label=o.label,
            arguments={k: parse_spec(o.policy).arguments[k] for k in varied},
            max_diff=o.report.max_diff,
            avg_diff=o.report.avg_diff,
            throughput_tok_s=o.report.throughput_tok_s,
        )
        for o in outcomes
        if o.policy in points and not o.job.variant
    ]
    return SweepSummary(spec, varied, points, rows)
