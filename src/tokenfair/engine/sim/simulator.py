"""Replay a trace through the real engine and scheduler on a virtual clock.

Arrivals and client cancellations are events in time (engine/trace_driver.py); between
them the engine steps, each step taking the time the profile says. When nothing is
left to run the clock jumps to the next event, so idle time costs nothing to simulate.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenfair.core.policies.base import Policy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.clock import VirtualClock
from tokenfair.engine.engine import Engine
from tokenfair.engine.sim.executor import SimExecutor, StepRecord
from tokenfair.engine.sim.profile import StepTimeProfile
from tokenfair.engine.trace_driver import ReplayResult, replay
from tokenfair.workloads.trace import TraceRecord


def request_from_trace(record: TraceRecord) -> Request:
    return Request(
        request_id=record.request_id,
        client=record.client,
        input_tokens=record.input_tokens,
        arrival_s=record.arrival_s,
        sampling=SamplingParams(max_tokens=record.max_tokens or record.output_tokens),
        priority=record.priority,
        target_output_tokens=record.output_tokens,
        prefix_group=record.prefix_group,
        prefix_tokens=record.prefix_tokens or 0,
    )


def simulate(
    trace: Sequence[TraceRecord],
    policy: Policy,
    profile: StepTimeProfile,
    config: SchedulerConfig,
    step_log: list[StepRecord] | None = None,
) -> ReplayResult:
    """Replay `trace`; `step_log`, if given, receives a record of every step."""
    ordered = sorted(trace, key=lambda r: r.arrival_s)
    clock = VirtualClock(ordered[0].arrival_s if ordered else 0.0)
    scheduler = Scheduler(config, policy)
    engine = Engine(scheduler, SimExecutor(profile, step_log, clock), clock)
    requests = [request_from_trace(r) for r in ordered]
    patience = [r.cancel_after_s for r in ordered]
    requested = [r.output_tokens for r in ordered]
    return replay(engine, requests, patience, requested, clock.jump_to, emit=False)
