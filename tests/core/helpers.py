"""Small builders shared by the core tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from tokenfair.core.batch import ExecutorOutput
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.scheduler import Scheduler
from tokenfair.engine.sim.executor import SIM_EOS_IDS

_ids = itertools.count()


def make_request(
    client: str = "a",
    input_tokens: int = 4,
    output_tokens: int = 4,
    arrival_s: float = 0.0,
    max_tokens: int | None = None,
    priority: int = 0,
    request_id: str | None = None,
    predicted: int | None = None,
) -> Request:
    return Request(
        request_id=request_id or f"r{next(_ids)}",
        client=client,
        input_tokens=input_tokens,
        arrival_s=arrival_s,
        sampling=SamplingParams(max_tokens=max_tokens or output_tokens),
        priority=priority,
        target_output_tokens=output_tokens,
        predicted_output_tokens=predicted,
        eos_token_ids=SIM_EOS_IDS,
    )


def fake_step(scheduler: Scheduler, now: float = 0.0):
    """Schedule one step and 'run' it: EOS at each request's target length."""
    out = scheduler.schedule(now)
    sampled = {}
    for s in out.scheduled:
        if s.samples:
            r = s.request
            sampled[r.request_id] = (
                0 if len(r.output_token_ids) + 1 >= r.target_output_tokens else 1
            )
    scheduler.update(out, ExecutorOutput(sampled=sampled), now)
    return out


def run_to_end(
    scheduler: Scheduler,
    made: Sequence[Request],
    before_step: Callable[[int], None] | None = None,
    after_step: Callable[[object], None] | None = None,
    max_steps: int = 20_000,
) -> None:
    """Replay `made` (by arrival) a step per second until every request has finished:
    arrivals at their step, then `before_step(step)`, the step (`fake_step`), then
    `after_step(its output)`."""
    arrived = step = 0
    while arrived < len(made) or scheduler.has_unfinished():
        now = float(step)
        while arrived < len(made) and made[arrived].arrival_s <= now:
            scheduler.add_request(made[arrived], now)
            arrived += 1
        if before_step is not None:
            before_step(step)
        out = fake_step(scheduler, now)
        if after_step is not None:
            after_step(out)
        step += 1
        assert step < max_steps


def batch_span(out) -> int:
    """Tokens a step's batch holds over its requests' whole lives: each one's prompt and
    max_tokens. Reserve admission keeps what the batch holds at any moment within the
    pool, yet this can exceed the pool: its peak check lets a long request's later growth
    use the space of short ones that finish first. Each scheduled request is in the
    batch until it finishes, so its remaining output is charged at most this many
    tokens (the M of the bound, as the paper's proof uses it)."""
    return sum(s.request.input_tokens + s.request.max_tokens for s in out.scheduled)
