"""Feed timed arrivals and client cancellations to an engine and step it until done.

The simulator and the real-engine replay share this loop; they differ only in how time
passes when nothing can run: the simulator jumps its virtual clock to the next event,
the replay sleeps until it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from tokenfair.core.request import Request
from tokenfair.engine.engine import Engine


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
