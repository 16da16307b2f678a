"""Least attained service with a half-life: a scheduling policy written only against
tokenfair's public policy API (`tokenfair.core.policies`, docs/policies.md).

The client that has received the least service recently goes next. Service decays
with a half-life, as in llm-d's program-aware fairness: a client that was busy an hour
ago is not held back for it now, and a client back from idle goes ahead of the ones
that kept the server busy meanwhile (VTC's lift does the opposite: it forgets the
idle time at once). Service is priced by the deployment's cost function and divided by
the client's weight, like VTC's. A client's own requests go in arrival order.

Run it anywhere a policy is named, with this folder on the Python path:

    PYTHONPATH=examples tokenfair simulate --trace trace.jsonl \\
        --policy 'least_attained:LeastAttainedService(half_life_s=30)'

Decay without a clock: every client's service is kept scaled to a common reference
time, so decaying everyone at once is free. A charge at time t adds amount x 2^(t/h),
which leaves the order between clients exactly as the decayed values would (every
client's service decays by the same factor). The policy's time is the latest `now` it
was given (arrivals and admissions); output charges between two of those count at
that time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from tokenfair.core.policies import Needs, Policy, PolicySettings, RequestView

# Rescale the stored values before 2^(t/h) could overflow a float's precision range.
_RESCALE_AT = 2.0**64


class LeastAttainedService(Policy):
    """Least attained service, decaying with a half-life (`half_life_s`; None: never)."""

    name = "least-attained"
    charges_output = True
    # Weighted, and fit to run inside vLLM (it only orders, charges and picks victims).
    needs = Needs(weights=True, vllm=True)

    def __init__(self, settings: PolicySettings, half_life_s: float | None = 60.0) -> None:
        if half_life_s is not None and not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0 or None, got {half_life_s}")
        self.settings = settings
        # The settings' own mapping: the server's admin API changes weights in it.
        self.weights = settings.weights
        self.half_life_s = half_life_s
        self._queues: dict[str, deque[RequestView]] = {}  # clients with waiting requests
        self._service: dict[str, float] = {}  # scaled to the reference time
        self._reference_s = 0.0  # when a stored 1.0 is worth 1.0
        self._now = 0.0
        self._scale = 1.0  # 2^((now - reference) / half-life)
        self._waiting = 0

    # --- the clock, as the hooks give it ---
    def _tick(self, now: float) -> None:
        if self.half_life_s is None or now <= self._now:
            return
        self._now = now
        self._scale = math.pow(2.0, (now - self._reference_s) / self.half_life_s)
        if self._scale > _RESCALE_AT:  # move the reference to now: divide everything
            for client in self._service:
                self._service[client] /= self._scale
            self._reference_s, self._scale = now, 1.0

    def _charge(self, client: str, service: float) -> None:
        weight = self.weights.get(client, 1.0)
        self._service[client] = self._service.get(client, 0.0) + self._scale * service / weight

    def attained(self) -> dict[str, float]:
        """Each client's decayed weighted service, as of the policy's time."""
        return {client: value / self._scale for client, value in self._service.items()}

    # --- the waiting queue ---
    def add(self, request: RequestView, now: float) -> None:
        self._tick(now)
        self._queues.setdefault(request.client, deque()).append(request)
        self._waiting += 1

    def requeue(self, request: RequestView) -> None:
        self._queues.setdefault(request.client, deque()).appendleft(request)
        self._waiting += 1

    def _order(self, client: str) -> tuple[float, float, str]:
        """Least service first; ties to the client whose head arrived first."""
        return (self._service.get(client, 0.0), self._queues[client][0].arrival_s, client)

    def peek(self) -> RequestView | None:
        if not self._queues:
            return None
        return self._queues[min(self._queues, key=self._order)][0]

    def pop(self) -> RequestView:
        if not self._queues:
            raise IndexError("pop from an empty waiting queue")
        client = min(self._queues, key=self._order)
        queue = self._queues[client]
        request = queue.popleft()
        if not queue:
            del self._queues[client]
        self._waiting -= 1
        return request

    def remove(self, request: RequestView) -> None:
        queue = self._queues.get(request.client)
        if queue is None or request not in queue:
            return
        queue.remove(request)
        if not queue:
            del self._queues[request.client]
        self._waiting -= 1

    def __len__(self) -> int:
        return self._waiting

    def waiting_requests(self) -> Iterable[RequestView]:
        for client in sorted(self._queues, key=self._order):
            yield from self._queues[client]

    # --- charges ---
    def on_admit(self, request: RequestView, first_time: bool, now: float) -> None:
        self._tick(now)
        if first_time:
            cost = self.settings.cost
            computed = request.input_tokens - request.cached_tokens
            share = self.settings.charge_cached_tokens
            prompt = cost.prefill(computed) + share * (
                cost.prefill(request.input_tokens) - cost.prefill(computed)
            )
            self._charge(request.client, prompt)

    def on_output(self, request: RequestView, new_tokens: int) -> None:
        # The paper's router makes the first output token in the prefill step and does
        # not charge it; the driver says so on the request (`first_token_free`).
        skip = 1 if request.first_token_free else 0
        end = max(0, request.num_output_tokens - skip)
        start = max(0, request.num_output_tokens - new_tokens - skip)
        if end > start:
            self._charge(
                request.client, self.settings.cost.output(request.input_tokens, start, end)
            )

    # --- preemption: the newest request of the most served client goes first ---
    def victim_key(self, request: RequestView) -> tuple:
        return (self._service.get(request.client, 0.0), request.admit_seq)

    def counters(self) -> dict[str, float]:
        return self.attained()
