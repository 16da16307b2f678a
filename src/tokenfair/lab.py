"""tokenfair in a notebook: a trace, policies, their runs on the simulator, SPEC's
metrics and the report's figures, in a few calls (docs/experiments.md, "In a notebook").

The numbers are those `tokenfair experiment compare` (and, for the arena trace,
`experiment paper`) reports for the same inputs: a run here is the same `Job` on the
same workload, simulated and scored by the same code. A policy may be a spec (`vtc`,
`rpm:20`, `mypkg.mod:MyPolicy(x=1)`) or an object built in the notebook itself, whose
class need not be importable: runs here stay in this process.

    from tokenfair import lab

    arena = lab.trace("arena")
    runs = lab.compare(arena, ["fcfs", "vtc", MyPolicy(lab.settings(arena))])
    for row in lab.table(runs):
        print(row.label, row.max_diff, row.throughput_tok_s)
    lab.save_figures(arena, runs, "out/notebook")
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from tokenfair.bundled import DATASETS, dataset
from tokenfair.core.policies import Policy, PolicyError, PolicySettings
from tokenfair.core.policies.loading import policy_label
from tokenfair.core.scheduler import ConfigError, SchedulerConfig
from tokenfair.experiments.naming import PolicyClash, check_distinct_labels
from tokenfair.experiments.runner import (
    DEFAULT_PROFILE,
    Job,
    PolicyFailed,
    RunOutcome,
    run_job,
    run_policy,
)
from tokenfair.experiments.summary import RunSummary, summary_row
from tokenfair.experiments.workloads import (
    ARENA,
    ARENA_DURATION_S,
    Workload,
    trace_workload,
)
from tokenfair.fairness.metrics import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S

__all__ = [
    "Comparison",
    "ConfigError",
    "PolicyClash",
    "PolicyError",
    "PolicyFailed",
    "compare",
    "config",
    "run",
    "save_figures",
    "settings",
    "table",
    "trace",
]


def trace(
    source: str | Path,
    *,
    duration_s: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    warmup_s: float = DEFAULT_WARMUP_S,
    weights: dict[str, float] | None = None,
) -> Workload:
    """A trace as a workload to run: a shipped one by name (`arena`: T = 600 s, as the
    paper's report has it) or a trace file (T: its last arrival in whole seconds, as
    `experiment compare` has it)."""
    names = {d.name for d in DATASETS}
    if isinstance(source, str) and source in names:
        path = dataset(source).path
        if source == ARENA and duration_s is None:
            duration_s = ARENA_DURATION_S
        name = source
    else:
        path, name = Path(source), None
    return trace_workload(path, name, duration_s, window_s, warmup_s, weights)


def config(
    preset: str = "paper", kv_tokens: int | None = None, prefix_caching: bool | None = None
) -> SchedulerConfig:
    """The scheduler a run has, as `tokenfair simulate --preset` builds it: the paper's
    router (10,000-token pool by default) or the vLLM-like engine preset (`kv_tokens`
    required; prefix caching on unless told not). ConfigError (a ValueError) otherwise."""
    given = {} if prefix_caching is None else {"enable_prefix_caching": prefix_caching}
    return SchedulerConfig.preset(preset, kv_tokens, **given)


def settings(workload: Workload) -> PolicySettings:
    """What a policy object is built with for `workload`: its clients' weights."""
    return PolicySettings(weights=dict(workload.weights or {}))


def run(
    workload: Workload,
    policy: str | Policy,
    scheduler: SchedulerConfig | None = None,
    profile: str = DEFAULT_PROFILE,
) -> RunOutcome:
    """One policy on `workload` (default scheduler: the paper's): per-request results
    (`.results`), SPEC's metrics (`.report`: `max_diff`, `avg_diff`, ...), what reports
    call it (`.label`). A policy that raises in a hook raises `PolicyFailed`, naming
    the hook."""
    chosen = scheduler or SchedulerConfig.paper()
    if isinstance(policy, str):
        return run_job(Job(workload, policy, chosen, profile))
    return run_policy(Job(workload, policy.name, chosen, profile), policy)


class Comparison(list[RunOutcome]):
    """The runs of `compare`, in the order of its policies, less those that failed:
    `failures` holds each failed policy's `PolicyFailed` (its policy, hook and error)."""

    def __init__(self, runs: Sequence[RunOutcome], failures: Sequence[PolicyFailed]) -> None:
        super().__init__(runs)
        self.failures = list(failures)


def compare(
    workload: Workload,
    policies: Sequence[str | Policy],
    scheduler: SchedulerConfig | None = None,
    profile: str = DEFAULT_PROFILE,
) -> Comparison:
    """Every policy on `workload`, one after the other, in this process. Two policies
    called alike in tables raise `PolicyClash` before any runs. A policy that raises in
    a hook is left out, as `experiment compare` leaves it out, with a warning naming
    the hook; the others' runs are returned, the failures in `.failures`."""
    check_distinct_labels([(_given(p), _label(p)) for p in policies], runner="this comparison")
    runs, failures = [], []
    for policy in policies:
        try:
            runs.append(run(workload, policy, scheduler, profile))
        except PolicyFailed as failure:
            warnings.warn(f"left out: {failure}", stacklevel=2)
            failures.append(failure)
    return Comparison(runs, failures)


def _given(policy: str | Policy) -> str:
    return policy if isinstance(policy, str) else f"{type(policy).__name__}()"


def _label(policy: str | Policy) -> str:
    """What the tables call a policy: a spec's label, an object's `name`."""
    return policy_label(policy) if isinstance(policy, str) else policy.name


def table(runs: Sequence[RunOutcome]) -> list[RunSummary]:
    """A row of headline figures per run: the columns of the reports and metrics.json."""
    return [summary_row(outcome) for outcome in runs]


def save_figures(workload: Workload, runs: Sequence[RunOutcome], folder: str | Path) -> list[Path]:
    """The report's figures of `runs` on `workload` (service rate and response time per
    client, the service difference), written as PNG under `folder`; their paths."""
    from tokenfair.report.figures import plot_workload  # matplotlib: only when asked

    out = Path(folder)
    return [out / figure.path for figure in plot_workload(workload, list(runs), out)]
