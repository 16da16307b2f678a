"""Experiments: run workloads under several policies and write their results.

`run_experiment` is the general pipeline; `run_paper_experiment` feeds it the paper's
suites (SPEC section 7), the arena trace and the ablation; `run_compare` feeds it one
trace file.

Measurement choices (SPEC section 6): for the arena trace T = 600 s, w = 60 s,
warmup = 30 s, as in the paper. For a synthetic suite T is the suite's duration (360,
600 or 900 s), with the same w = 60 s and warmup = 30 s: the window is long enough to
hold many requests of every client and short enough to show the ON/OFF and
distribution-shift phases (60 s and 300 s long). Requests still queued at T are served
(the simulation drains) but the ticks stop at T, so the drain does not dilute the
fairness figures; throughput covers the whole run, first arrival to last finish.

Output layout under `out_dir` (this module writes the data; tokenfair.report adds the
report and figures from the returned `ExperimentResult`):

    metrics.json               every run's summary row, the ablation and the target checks
    results/<workload>/<policy>.jsonl   per-request results (read by `tokenfair metrics`)
    report.md, report.html     the report (report.html references figures/ relatively)
    figures/*.png              the plots
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenfair.core.policies.loading import policy_label
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.experiments.ablation import AblationRow, ablation_jobs, ablation_row
from tokenfair.experiments.locality import (
    DEFAULT_SEEDS,
    LocalityResult,
    is_locality_outcome,
    locality_jobs,
    locality_rows,
    locality_settings,
)
from tokenfair.experiments.naming import PolicyClash, check_policy_specs, results_stem
from tokenfair.experiments.neighbor import DEFAULT_SEEDS as NEIGHBOR_SEEDS
from tokenfair.experiments.neighbor import (
    NeighborRow,
    is_neighbor_outcome,
    neighbor_jobs,
    neighbor_rows,
    neighbor_settings,
)
from tokenfair.experiments.runner import (
    DEFAULT_PROFILE,
    DEFAULT_WORKERS,
    Job,
    PolicyFailed,
    ProgressFn,
    RunOutcome,
    run_jobs,
)
from tokenfair.experiments.seeds import (
    SeedSpread,
    is_seed_outcome,
    jittered,
    reseeded,
    seed_spreads,
)
from tokenfair.experiments.summary import RunSummary, summary_row
from tokenfair.experiments.sweep import SweepSummary, sweep_points, sweep_summary
from tokenfair.experiments.targets import TargetCheck, check_targets
from tokenfair.experiments.workloads import (
    ARENA,
    PAPER_SUITES,
    Workload,
    paper_workloads,
    suite_workload,
    trace_workload,
)
from tokenfair.fairness.metrics import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S
from tokenfair.measured import read_measured_reference
from tokenfair.results import ResultRecord, write_results

# The schedulers of the paper's real-trace table, the artifact's exact VTC queue (the
# one the paper's VTC row was measured with), and our preempting VTC.
PAPER_POLICIES = (
    "fcfs",
    "lcf",
    "vtc",
    "vtc-artifact",
    "vtc-predict",
    "vtc-oracle",
    "rpm:5",
    "rpm:20",
    "rpm:30",
    "vtc-preempt",
)
# The paper's synthetic figures compare FCFS with VTC; --quick runs only those on the
# suites (the arena table stays complete).
QUICK_SUITE_POLICIES = ("fcfs", "vtc")
# Weighted VTC runs on the weighted suite only: elsewhere every weight is 1.
WEIGHTED_SUITE = "overload-weighted"
WEIGHTED_POLICY = "wvtc"
# The ablation compares VTC with FCFS in the full run; --quick runs VTC alone.
ABLATION_POLICIES = ("fcfs", "vtc")
QUICK_ABLATION_POLICIES = ("vtc",)
# The arena trace served FCFS on the paper's A10G system (under shared/): the report
# compares the simulated FCFS run with it request by request.
MEASURED_FCFS_ARENA = "reference/a10g_llama7b_fcfs_arena_measured.jsonl"


@dataclass(slots=True)
class ExperimentResult:
    """Everything one experiment produced, and where it was written."""

    title: str
    out_dir: Path
    workloads: list[Workload]
    outcomes: list[RunOutcome]
    ablation: list[AblationRow] = field(default_factory=list)
    ablation_outcomes: list[RunOutcome] = field(default_factory=list)
    targets: list[TargetCheck] = field(default_factory=list)
    quick: bool = False
    wall_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    # The measured FCFS run of the arena trace (shared/), when the run had it.
    measured_fcfs_arena: list[ResultRecord] = field(default_factory=list)
    # Beyond the paper: clients sharing prompt prefixes (experiments/locality.py).
    locality: LocalityResult | None = None
    # Beyond the paper: a tenant flooding long prompts (experiments/neighbor.py).
    neighbor: list[NeighborRow] = field(default_factory=list)
    neighbor_settings: dict[str, Any] = field(default_factory=dict)
    # Policies that raised inside a hook: left out of everything above, one line each.
    failures: list[str] = field(default_factory=list)
    # The synthetic suites over several draws (experiments/seeds.py), when asked.
    seed_spreads: list[SeedSpread] = field(default_factory=list)
    seed_outcomes: list[RunOutcome] = field(default_factory=list)  # draws 1 .. N-1
    # A policy of one's own over a grid of its arguments (experiments/sweep.py).
    sweep: SweepSummary | None = None

    def outcomes_for(self, workload: str) -> list[RunOutcome]:
        return [o for o in self.outcomes if o.workload.name == workload]

    def rows_for(self, workload: str) -> list[RunSummary]:
        return [summary_row(o) for o in self.outcomes_for(workload)]

    @property
    def report_md(self) -> Path:
        return self.out_dir / "report.md"

    @property
    def report_html(self) -> Path:
        return self.out_dir / "report.html"


def policies_for(workload: Workload, policies: Sequence[str]) -> list[str]:
    """The policies to run on a workload: weighted VTC joins when clients have weights."""
    chosen = list(policies)
    if workload.weights and WEIGHTED_POLICY not in chosen:
        chosen.append(WEIGHTED_POLICY)
    return chosen


def _result_path(out_dir: Path, outcome: RunOutcome) -> Path:
    # Named as reports call it (a policy of one's own by its label or class name).
    stem = results_stem(outcome.label)
    if outcome.job.variant:
        stem += "_" + results_stem(outcome.job.variant)  # kv-5000, seed-2
    return out_dir / "results" / outcome.workload.name / f"{stem}.jsonl"


def write_run_files(result: ExperimentResult) -> None:
    """Per-request results of every run and metrics.json with every summary row."""
    locality = result.locality.outcomes if result.locality is not None else []
    written: dict[Path, RunOutcome] = {}
    for outcome in [*result.outcomes, *result.seed_outcomes, *locality]:
        path = _result_path(result.out_dir, outcome)
        if path in written:  # the policies' check missed a clash: never lose a run's file
            raise PolicyClash(
                f"{written[path].job.label} and {outcome.job.label} would both be written to "
                f"{path}: give one policy another label"
            )
        written[path] = outcome
    for path, outcome in written.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_results(outcome.results, path)
    summary = {
        "title": result.title,
        "quick": result.quick,
        "wall_s": result.wall_s,
        "settings": result.settings,
        "workloads": [
            {
                "name": w.name,
                "description": w.description,
                "requests": len(w.records),
                "duration_s": w.duration_s,
                "window_s": w.window_s,
                "warmup_s": w.warmup_s,
                "weights": w.weights,
            }
            for w in result.workloads
        ],
        "runs": [summary_row(o).to_json() for o in result.outcomes],
        "ablation": [
            {**row_fields(row), "ratio_to_bound": row.ratio_to_bound} for row in result.ablation
        ],
        "targets": [row_fields(t) for t in result.targets],
    }
    if result.failures:
        summary["failures"] = result.failures
    if result.locality is not None:
        summary["locality"] = {
            "settings": result.locality.settings,
            "rows": [asdict(row) for row in result.locality.rows],
        }
    if result.seed_spreads:
        summary["seeds"] = [asdict(row) for row in result.seed_spreads]
    if result.sweep is not None:
        summary["sweep"] = asdict(result.sweep)
    if result.neighbor:
        summary["long_neighbor"] = {
            "settings": result.neighbor_settings,
            "rows": [asdict(row) for row in result.neighbor],
        }
    (result.out_dir / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")


def _split(
    outcomes: Sequence[RunOutcome], belongs: Callable[[RunOutcome], bool]
) -> tuple[list[RunOutcome], list[RunOutcome]]:
    """(the outcomes that `belongs` claims, the others), each in the order given."""
    return [o for o in outcomes if belongs(o)], [o for o in outcomes if not belongs(o)]


def row_fields(row: AblationRow | TargetCheck) -> dict[str, Any]:
    return asdict(row)


def _finish(result: ExperimentResult, started: float) -> ExperimentResult:
    result.out_dir.mkdir(parents=True, exist_ok=True)
    result.wall_s = time.perf_counter() - started
    write_run_files(result)
    return result


def run_experiment(
    workloads: Sequence[Workload],
    policies: Sequence[str],
    out_dir: Path,
    *,
    title: str = "tokenfair experiment",
    profile: str = DEFAULT_PROFILE,
    config: SchedulerConfig | None = None,
    workers: int = DEFAULT_WORKERS,
    progress: ProgressFn | None = None,
    preset: str = "paper",
    sweep: str | None = None,
) -> ExperimentResult:
    """Run every policy on every workload and write their results and metrics.json
    (`preset`: what `config` is, for the report: paper or engine; `sweep`: a policy
    of one's own over a grid of its arguments, its points run beside `policies`)."""
    policies = [*policies, *sweep_points(sweep)]
    weighted = any(w.weights for w in workloads) and WEIGHTED_POLICY not in policies
    check_policy_specs(policies, [WEIGHTED_POLICY] if weighted else [], "this comparison")
    started = time.perf_counter()
    chosen = config or SchedulerConfig.paper()
    jobs = [Job(w, p, chosen, profile) for w in workloads for p in policies_for(w, policies)]
    failures: list[PolicyFailed] = []
    outcomes = run_jobs(jobs, workers, progress, failures)
    failed = {f.policy for f in failures}
    if failed and not outcomes:
        raise ValueError("; ".join(str(f) for f in failures))
    kept = [p for p in policies if p not in failed]
    result = ExperimentResult(
        title=title,
        out_dir=Path(out_dir),
        workloads=list(workloads),
        outcomes=outcomes,
        settings={
            "profile": profile,
            "preset": preset,
            "kv_tokens": chosen.kv_tokens,
            "prefix_caching": chosen.enable_prefix_caching,
            "policies": kept,
        },
        failures=[str(f) for f in failures],
        sweep=sweep_summary(sweep, outcomes) if sweep else None,
    )
    return _finish(result, started)


def run_paper_experiment(
    out_dir: Path,
    quick: bool = False,
    shared_dir: Path = Path("../shared"),
    progress: ProgressFn | None = None,
    *,
    workers: int = DEFAULT_WORKERS,
    suites: Sequence[str] | None = None,
    ablation: bool = True,
    locality: bool = True,
    neighbor: bool = True,
    extra_policies: Sequence[str] = (),
    seeds: int = 1,
    sweep: str | None = None,
) -> ExperimentResult:
    """The paper's experiments: the arena table, every synthetic suite, the ablation,
    and beyond the paper the locality experiment (clients sharing prompt prefixes).

    `quick` runs the suites and the ablation under fewer policies and the locality
    experiment on one seed; the arena trace always runs under every policy of the
    paper's table. `suites` picks a subset (tests). `extra_policies` (one's own, or
    other built-in names) run beside the paper's on the arena trace, every suite and the
    ablation (PolicyClash, before anything runs, for one called like another); one that
    fails is left out and said in `failures`, the others' results kept. `seeds` > 1
    draws every synthetic suite that many times and replays the arena trace as often
    with its arrivals jittered by up to 1 ms (experiments/seeds.py): the tables keep
    draw 0, `seed_spreads` gives each policy's median and range over all of them.
    `sweep` runs a policy of one's own over a grid of its arguments beside the extras,
    summed up in `sweep` (experiments/sweep.py).
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    extras = [*extra_policies, *sweep_points(sweep)]
    check_policy_specs(extras, [*PAPER_POLICIES, WEIGHTED_POLICY], "the paper experiment")
    started = time.perf_counter()
    config = SchedulerConfig.paper()
    workloads = paper_workloads(shared_dir, PAPER_SUITES if suites is None else suites)
    arena_policies = [*PAPER_POLICIES, *extras]
    suite_policies = [*(QUICK_SUITE_POLICIES if quick else PAPER_POLICIES), *extras]
    jobs = []
    for workload in workloads:
        policies = arena_policies if workload.name == ARENA else suite_policies
        jobs += [Job(workload, p, config) for p in policies_for(workload, policies)]
    jobs += reseeded(jobs, seeds, _draw)  # draws 1 .. seeds-1
    if ablation:
        ablating = QUICK_ABLATION_POLICIES if quick else ABLATION_POLICIES
        jobs += ablation_jobs([*ablating, *extras])
    locality_seeds = DEFAULT_SEEDS[:1] if quick else DEFAULT_SEEDS
    if locality:
        jobs += locality_jobs(locality_seeds)
    neighbor_seeds = NEIGHBOR_SEEDS[:1] if quick else NEIGHBOR_SEEDS
    if neighbor:
        jobs += neighbor_jobs(neighbor_seeds)
    failures: list[PolicyFailed] = []
    outcomes = run_jobs(jobs, workers, progress, failures)
    failed = {f.policy for f in failures}
    # The experiments beyond the paper claim their runs by their own workloads first:
    # the locality runs are marked `seed k` too (its draws), which the seeds' test
    # alone would take for extra draws of a paper suite.
    neighbor_outcomes, outcomes = _split(outcomes, is_neighbor_outcome)
    locality_outcomes, outcomes = _split(outcomes, is_locality_outcome)
    seeded, outcomes = _split(outcomes, is_seed_outcome)
    main = [o for o in outcomes if not o.job.variant]
    measured_path = shared_dir / MEASURED_FCFS_ARENA
    result = ExperimentResult(
        title="tokenfair: reproducing “Fairness in Serving Large Language Models”",
        out_dir=Path(out_dir),
        workloads=workloads,
        outcomes=main,
        ablation=[ablation_row(o) for o in outcomes if o.job.variant],
        ablation_outcomes=[o for o in outcomes if o.job.variant],
        targets=check_targets(main),
        quick=quick,
        settings={
            "profile": DEFAULT_PROFILE,
            "kv_tokens": config.kv_tokens,
            "system": "SchedulerConfig.paper(): the paper's S-LoRA/LightLLM router",
            "policies": [p for p in arena_policies if p not in failed],
            "suite_policies": [p for p in suite_policies if p not in failed],
            "extra_policies": [p for p in extras if p not in failed],
            "workers": workers,
        },
        measured_fcfs_arena=(
            read_measured_reference(measured_path) if measured_path.exists() else []
        ),
        locality=(
            LocalityResult(
                rows=locality_rows(locality_outcomes),
                outcomes=locality_outcomes,
                settings=locality_settings(locality_seeds),
            )
            if locality_outcomes
            else None
        ),
        neighbor=neighbor_rows(neighbor_outcomes),
        neighbor_settings=neighbor_settings(neighbor_seeds) if neighbor_outcomes else {},
        failures=[str(f) for f in failures],
        seed_spreads=seed_spreads(main + seeded),
        seed_outcomes=seeded,
        sweep=sweep_summary(sweep, main) if sweep else None,
    )
    if seeds > 1:
        result.settings["seeds"] = seeds
    return _finish(result, started)


def _draw(workload: Workload, seed: int) -> Workload:
    """Draw `seed` of a paper workload: the suite generated with that seed; the arena
    trace, one fixed trace, with its arrivals jittered by up to 1 ms."""
    return (
        jittered(workload, seed) if workload.name == ARENA else suite_workload(workload.name, seed)
    )


def run_compare(
    trace_path: Path,
    policies: Sequence[str],
    out_dir: Path,
    *,
    profile: str = DEFAULT_PROFILE,
    duration_s: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    warmup_s: float = DEFAULT_WARMUP_S,
    weights: dict[str, float] | None = None,
    workers: int = DEFAULT_WORKERS,
    progress: ProgressFn | None = None,
    config: SchedulerConfig | None = None,
    preset: str = "paper",
    sweep: str | None = None,
) -> ExperimentResult:
    """Replay one trace under `policies` (and the points of `sweep`) on `config`
    (default: the paper's system) and write the same files."""
    workload = trace_workload(trace_path, None, duration_s, window_s, warmup_s, weights)
    labels = ", ".join(policy_label(p) for p in [*policies, *([sweep] if sweep else [])])
    return run_experiment(
        [workload],
        policies,
        out_dir,
        title=f"tokenfair: {labels} on {trace_path.name}",
        profile=profile,
        config=config,
        workers=workers,
        progress=progress,
        preset=preset,
        sweep=sweep,
    )
