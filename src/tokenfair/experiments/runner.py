"""Run many (workload, policy) simulations, in parallel processes, and score each one.

A `Job` is one simulation: a workload (trace records plus how to measure it), a policy
name and a scheduler configuration. `run_jobs` runs a list of them, on a small process
pool when there is more than one job and more than one worker (each simulation is
single-threaded, pure Python, and independent of the others), and returns one
`RunOutcome` per job, in the order given.

The fairness metrics are computed in the worker, so only the per-request results and
the report travel back. A policy that raises inside one of its hooks fails its job as
`PolicyFailed`, one line naming the policy, the hook and the error; given a list to
collect them in, `run_jobs` keeps running the other jobs and leaves out every job of a
policy that failed anywhere (a policy reported on some workloads only would mislead).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from types import TracebackType

from tokenfair.core.policies import Policy, make_policy
from tokenfair.core.policies.loading import policy_label
from tokenfair.core.policies.registry import is_builtin, uses_weights
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.experiments.workloads import Workload
from tokenfair.fairness.report import FairnessReport, fairness_report
from tokenfair.results import ResultRecord

DEFAULT_PROFILE = "a10g-llama-7b"
# The demo must run well under 5 minutes on a 2-core machine; more workers than cores
# would only slow each simulation down.
DEFAULT_WORKERS = max(1, min(2, os.cpu_count() or 1))

# progress(done, total, label of the job just finished)
ProgressFn = Callable[[int, int, str], None]


class PolicyFailed(Exception):
    """A policy raised inside one of its hooks (`hook`: the method the simulator called)."""

    def __init__(self, policy: str, hook: str, error: str, workload: str) -> None:
        self.policy, self.hook, self.error, self.workload = policy, hook, error, workload
        super().__init__(f"policy {policy!r} failed in {hook} on {workload}: {error}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:  # across processes
        return (PolicyFailed, (self.policy, self.hook, self.error, self.workload))


def _hook_of(trace: TracebackType | None, policy: object) -> str | None:
    """The policy's method that the driver called, in which `trace` ended (the outermost
    frame whose `self` is the policy); None: it did not end in the policy's code."""
    while trace is not None:
        frame = trace.tb_frame
        if frame.f_locals.get("self") is policy:
            return frame.f_code.co_name
        trace = trace.tb_next
    return None


@dataclass(frozen=True, slots=True)
class Job:
    """One simulation: `policy` (a registry name such as `vtc` or `rpm:20`) on `workload`."""

    workload: Workload
    policy: str
    config: SchedulerConfig = field(default_factory=SchedulerConfig.paper)
    profile: str = DEFAULT_PROFILE
    # Tells apart jobs of the same workload and policy (e.g. the ablation's pool sizes).
    variant: str = ""

    @property
    def label(self) -> str:
        suffix = f" [{self.variant}]" if self.variant else ""
        return f"{self.workload.name} / {self.policy}{suffix}"


@dataclass(slots=True)
class RunOutcome:
    """What one job produced: per-request results, the fairness report, simulator stats."""

    job: Job
    results: list[ResultRecord]
    report: FairnessReport
    makespan_s: float
    steps: int
    preemptions: int
    wall_s: float

    @property
    def workload(self) -> Workload:
        return self.job.workload

    @property
    def policy(self) -> str:
        return self.job.policy

    @property
    def label(self) -> str:
        """What reports call its policy (core/policies/loading.py: `policy_label`)."""
        return policy_label(self.job.policy)


def run_job(job: Job) -> RunOutcome:
    """Simulate one job and compute its fairness report (runs in a worker process)."""
    started = time.perf_counter()
    workload = job.workload
    # Only weighted VTC is told the weights: the other policies are the paper's
    # unweighted ones, whose unfairness to weighted clients is what the suite shows. A
    # user's policy is told them when its class says it reads them (`uses_weights`).
    weighted = job.policy.startswith("wvtc") or (
        not is_builtin(job.policy) and uses_weights(job.policy)
    )
    policy = make_policy(job.policy, weights=workload.weights if weighted else None)
    return run_policy(job, policy, started)


def run_policy(job: Job, policy: Policy, started: float | None = None) -> RunOutcome:
    """Simulate `job` under `policy`, already built (`job.policy` names it in reports),
    and compute its fairness report."""
    started = time.perf_counter() if started is None else started
    workload = job.workload
    try:
        sim = simulate(list(workload.records), policy, load_profile(job.profile), job.config)
    except Exception as error:
        hook = _hook_of(error.__traceback__, policy)
        if hook is None:  # not the policy's code: a bug of ours, with its traceback
            raise
        problem = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise PolicyFailed(job.policy, hook, problem, workload.name) from None
    report = fairness_report(
        sim.results,
        duration_s=workload.duration_s,
        window_s=workload.window_s,
        warmup_s=workload.warmup_s,
        weights=workload.weights,
    )
    return RunOutcome(
        job=job,
        results=sim.results,
        report=report,
        makespan_s=sim.makespan_s,
        steps=sim.steps,
        preemptions=sim.preemptions,
        wall_s=time.perf_counter() - started,
    )


def run_jobs(
    jobs: Sequence[Job],
    workers: int = DEFAULT_WORKERS,
    progress: ProgressFn | None = None,
    failures: list[PolicyFailed] | None = None,
) -> list[RunOutcome]:
    """Run every job; outcomes come back in the order of `jobs`. A policy that fails
    raises `PolicyFailed`, or, with `failures` given, is appended to it (once per
    policy) and every job of it left out, the others run to the end."""
    total = len(jobs)
    outcomes: list[RunOutcome | None] = [None] * total
    failed: dict[str, PolicyFailed] = {}

    def settle(index: int, run: Callable[[], RunOutcome]) -> None:
        try:
            outcomes[index] = run()
        except PolicyFailed as failure:
            if failures is None:
                raise
            failed.setdefault(failure.policy, failure)

    if workers <= 1 or total <= 1:
        for index, job in enumerate(jobs):
            settle(index, functools.partial(run_job, job))
            if progress:
                progress(index + 1, total, job.label)
    else:
        with ProcessPoolExecutor(max_workers=min(workers, total)) as pool:
            # Longest jobs first keeps both workers busy to the end.
            order = sorted(range(total), key=lambda i: -len(jobs[i].workload.records))
            futures = {pool.submit(run_job, jobs[i]): i for i in order}
            for done, future in enumerate(as_completed(futures), start=1):
                index = futures[future]
                settle(index, future.result)
                if progress:
                    progress(done, total, jobs[index].label)
    if failures is not None:
        failures.extend(failed.values())
    return [o for o in outcomes if o is not None and o.policy not in failed]
