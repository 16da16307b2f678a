"""One ReplayResult for both replays: an engine that already served requests reports
only this replay's steps, busy time and preemptions."""

from __future__ import annotations

import pytest

from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.clock import VirtualClock
from tokenfair.engine.engine import Engine
from tokenfair.engine.sim.executor import SimExecutor
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import request_from_trace, simulate
from tokenfair.engine.trace_driver import replay
from tokenfair.workloads.trace import TraceRecord


def crowd(offset: float, tag: str) -> list[TraceRecord]:
    return [TraceRecord(offset + 0.01 * i, f"c{i % 2}", 64, 200, f"{tag}{i}") for i in range(12)]


def test_a_reused_engine_reports_only_this_replay() -> None:
    config = SchedulerConfig(kv_tokens=1024, max_num_seqs=16, max_batched_tokens=512)
    profile = load_profile("a10g-llama-7b")
    clock = VirtualClock(0.0)
    engine = Engine(Scheduler(config, make_policy("fcfs")), SimExecutor(profile), clock)
    runs = []
    for offset, tag in ((0.0, "a"), (1000.0, "b")):
        trace = crowd(offset, tag)
        clock.jump_to(offset)
        requests = [request_from_trace(r) for r in trace]
        runs.append(
            replay(engine, requests, [None] * 12, [r.output_tokens for r in trace], clock.jump_to)
        )
    alone = simulate(crowd(1000.0, "b"), make_policy("fcfs"), profile, config)
    second = runs[1]
    assert second.steps == alone.steps and second.preemptions == alone.preemptions > 0
    assert second.busy_s == pytest.approx(alone.busy_s, rel=1e-9)
    assert sum(second.preemptions_by_client.values()) == second.preemptions
    assert engine.num_steps == runs[0].steps + second.steps
    assert [r.requested_output_tokens for r in second.results] == [200] * 12
    assert second.generated_tokens == 12 * 200
