"""Replay a trace through the real engine and scheduler on a virtual clock.

Arrivals and client cancellations are events in time (engine/trace_driver.py); between
them the engine steps, each step taking the time the profile says. When nothing is
left to run the clock jumps to the next event, so idle time costs nothing to simulate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenfair.bench.results import ResultRecord
from tokenfair.core.policies.base import Policy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.clock import VirtualClock
from tokenfair.engine.engine import Engine
from tokenfair.engine.sim.executor import SimExecutor, StepRecord
from tokenfair.engine.sim.profile import StepTimeProfile
from tokenfair.engine.trace_driver import drive_trace
from tokenfair.workloads.trace import TraceRecord


@dataclass(slots=True)
class SimulationResult:
    results: list[ResultRecord]
    makespan_s: float  # first arrival to last finish
    steps: int
    busy_s: float
    preemptions: int
    swaps: int
    counters: dict[str, float]
    preemptions_by_client: dict[str, int]
    # `preemptions` split by cause: the pool was short (a sizing problem), or the
    # policy chose to admit a waiting request (vtc-preempt, priority).
    memory_preemptions: int = 0
    policy_preemptions: int = 0
    memory_preemptions_by_client: dict[str, int] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return sum(r.output_tokens for r in self.results)


def request_from_trace(record: TraceRecord) -> Request:
    return Request(
        request_id=record.request_id,
        client=record.client,
        input_tokens=record.input_tokens,
        arrival_s=record.arrival_s,
        sampling=SamplingParams(max_tokens=record.max_tokens or record.output_tokens),
        priority=record.priority,
        target_output_tokens=record.output_tokens,
    )


def result_from_request(request: Request) -> ResultRecord:
    return ResultRecord(
        request_id=request.request_id,
        client=request.client,
        arrival_s=request.arrival_s,
        input_tokens=request.input_tokens,
        output_tokens=request.num_output_tokens,
        scheduled_s=request.scheduled_s,
        first_token_s=request.first_token_s,
        finish_s=request.finish_s,
        status=request.status.value,
        finish_reason=request.finish_reason.value if request.finish_reason else None,
        preemptions=request.preemptions,
    )


def simulate(
    trace: Sequence[TraceRecord],
    policy: Policy,
    profile: StepTimeProfile,
    config: SchedulerConfig,
    step_log: list[StepRecord] | None = None,
) -> SimulationResult:
    """Replay `trace`; `step_log`, if given, receives a record of every step."""
    ordered = sorted(trace, key=lambda r: r.arrival_s)
    clock = VirtualClock(ordered[0].arrival_s if ordered else 0.0)
    scheduler = Scheduler(config, policy)
    engine = Engine(scheduler, SimExecutor(profile, step_log, clock), clock)
    requests = [request_from_trace(r) for r in ordered]
    patience = [r.cancel_after_s for r in ordered]
    drive_trace(engine, requests, patience, clock.jump_to, emit=False)
    results = [result_from_request(r) for r in requests]
    finishes = [r.finish_s for r in requests if r.finish_s is not None]
    makespan = (max(finishes) - requests[0].arrival_s) if finishes else 0.0
    return SimulationResult(
        results=results,
        makespan_s=makespan,
        steps=engine.num_steps,
        busy_s=engine.busy_s,
        preemptions=scheduler.num_preemptions,
        swaps=scheduler.num_swaps,
        counters=policy.counters(),
        preemptions_by_client=dict(scheduler.preemptions_by_client),
        memory_preemptions=scheduler.num_memory_preemptions,
        policy_preemptions=scheduler.num_policy_preemptions,
        memory_preemptions_by_client=dict(scheduler.memory_preemptions_by_client),
    )
