"""Replay a trace on a real model, on the wall clock: the real-engine twin of
`tokenfair.engine.sim.simulator.simulate`.

Each trace request becomes random prompt tokens of its input length and generates
exactly its output length (EOS ignored; the scheduler stops it at the trace's
`output_tokens`), with the trace's `max_tokens` as its limit, which is what the
simulator does, so the two makespans are comparable.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from tokenfair.core.request import Request, SamplingParams
from tokenfair.engine.engine import Engine
from tokenfair.engine.trace_driver import ReplayResult, replay
from tokenfair.workloads.trace import TraceRecord


def trace_requests(trace: Sequence[TraceRecord], vocab_size: int, seed: int = 0) -> list[Request]:
    """Requests with random prompt tokens, in arrival order, arrival times as in the trace."""
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for record in sorted(trace, key=lambda r: r.arrival_s):
        prompt = torch.randint(0, vocab_size, (record.input_tokens,), generator=generator).tolist()
        limit = record.max_tokens or record.output_tokens
        sampling = SamplingParams(max_tokens=limit, ignore_eos=True)
        requests.append(
            Request(
                record.request_id,
                record.client,
                record.input_tokens,
                record.arrival_s,
                sampling,
                prompt_token_ids=prompt,
                priority=record.priority,
                target_output_tokens=record.output_tokens,
            )
        )
    return requests


def replay_trace(
    engine: Engine, trace: Sequence[TraceRecord], vocab_size: int, seed: int = 0
) -> ReplayResult:
    """Run the trace in real time: each request is added once the engine's clock reaches
    its arrival (offset so the first arrival is now), clients give up after their
    `cancel_after_s`, and idle gaps are slept through."""
    requests = trace_requests(trace, vocab_size, seed)
    if not requests:
        return ReplayResult([], 0.0, 0, 0.0)
    offset = engine.clock.now() - requests[0].arrival_s
    for request in requests:
        request.arrival_s += offset

    def sleep_until(t: float) -> None:
        time.sleep(max(0.0, t - engine.clock.now()))

    ordered = sorted(trace, key=lambda r: r.arrival_s)
    patience = [record.cancel_after_s for record in ordered]
    requested = [record.output_tokens for record in ordered]
    return replay(engine, requests, patience, requested, sleep_until)
