"""Feed timed arrivals and client cancellations to an engine and step it until done.

The simulator and the real-engine replay share this loop; they differ only in how time
passes when nothing can run: the simulator jumps its virtual clock to the next event,
the replay sleeps until it. Both return a `ReplayResult`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokenfair.core.request import Request
from tokenfair.engine.engine import Engine
from tokenfair.results import ResultRecord, result_from_request


@dataclass(slots=True)
class ReplayResult:
    """What a trace replay did: per-request results and the engine's totals for the run."""

    results: list[ResultRecord]
    makespan_s: float  # first arrival to last finish
    steps: int
    busy_s: float
    preemptions: int = 0
    swaps: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # the policy's, at the end
    preemptions_by_client: dict[str, int] = field(default_factory=dict)
    # `preemptions` split by cause: the pool was short (a sizing problem), or the
    # policy chose to admit a waiting request (vtc-preempt, priority).
    memory_preemptions: int = 0
    policy_preemptions: int = 0
    memory_preemptions_by_client: dict[str, int] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return sum(r.output_tokens for r in self.results)


def replay(
    engine: Engine,
    requests: Sequence[Request],
    patience: Sequence[float | None],
    requested_output_tokens: Sequence[int | None],
    wait_until: Callable[[float], None],
    emit: bool = True,
) -> ReplayResult:
    """Drive the requests through the engine (`drive_trace`) and collect what this run
    did; the engine's cumulative counts are taken as differences, so an engine that
    served earlier requests reports only this replay."""
    before = engine.stats()
    drive_trace(engine, requests, patience, wait_until, emit)
    after = engine.stats()
    finishes = [r.finish_s for r in requests if r.finish_s is not None]
    makespan = (max(finishes) - requests[0].arrival_s) if finishes else 0.0
    return ReplayResult(
        results=[
            result_from_request(r, n)
            for r, n in zip(requests, requested_output_tokens, strict=True)
        ],
        makespan_s=makespan,
        steps=after.num_steps - before.num_steps,
        busy_s=after.busy_s - before.busy_s,
        preemptions=after.num_preemptions - before.num_preemptions,
        swaps=after.num_swaps - before.num_swaps,
        counters=after.counters,
        preemptions_by_client=after.preemptions_since(before),
        memory_preemptions=after.num_memory_preemptions - before.num_memory_preemptions,
        policy_preemptions=after.num_policy_preemptions - before.num_policy_preemptions,
        memory_preemptions_by_client=after.memory_preemptions_since(before),
    )


class StalledError(RuntimeError):
    """Requests wait but none can ever be admitted (a scheduler bug, never user input)."""


def drive_trace(
    engine: Engine,
    requests: Sequence[Request],
    patience: Sequence[float | None],
    wait_until: Callable[[float], None],
    emit: bool = True,
) -> None:
    """Add each request once the engine's clock reaches its arrival; abort it if the
    client's patience (seconds after arrival, or None) runs out first.

    `requests` must be in arrival order; cancellations take effect at the first step
    boundary after their deadline.
    """
    cancels: list[tuple[float, int, str]] = []  # (deadline, order, request id)
    next_arrival = 0
    while next_arrival < len(requests) or engine.has_unfinished():
        now = engine.clock.now()
        while next_arrival < len(requests) and requests[next_arrival].arrival_s <= now:
            request = requests[next_arrival]
            engine.add_request(request)
            if patience[next_arrival] is not None:
                deadline = request.arrival_s + patience[next_arrival]  # type: ignore[operator]
                heapq.heappush(cancels, (deadline, next_arrival, request.request_id))
            next_arrival += 1
        while cancels and cancels[0][0] <= now:
            engine.abort(heapq.heappop(cancels)[2])
        steps_before = engine.num_steps
        if engine.has_unfinished():
            engine.step(emit=emit)
        if engine.num_steps == steps_before:
            # Nothing could run: wait for the next event.
            upcoming = [requests[next_arrival].arrival_s] if next_arrival < len(requests) else []
            if cancels:
                upcoming.append(cancels[0][0])
            if not upcoming:
                if engine.has_unfinished():
                    raise StalledError("requests wait but none can be admitted")
                return
            wait_until(min(upcoming))
