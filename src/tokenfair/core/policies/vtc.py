"""The Virtual Token Counter (Sheng et al., OSDI 2024) and its variants.

Every client has a counter of the (weighted) service it has received. Whenever the
batch has room, the waiting client with the smallest counter sends its oldest request,
or, when its requests carry priorities, its most urgent one (lower first, vLLM's
convention; ties by arrival): a client orders its own work, and no priority moves it
ahead of another client.
Admission charges the prompt, every generated token charges the output, both divided
by the client's weight. A client that comes back from idle is lifted to the smallest
counter among waiting clients (or, with nobody waiting, to the counter of the client
admitted last), so idle time cannot be banked as credit.

Variants, all this one class:
- lcf: no lift (least counter first), to show why the lift matters;
- the artifact's lift: no lift when nobody else waits (the authors' code);
- length prediction: charge the predicted output at admission, then only tokens
  beyond it, refunding the unused part at finish (predict = moving average per
  client, oracle = the true length);
- preemption: when the head client's counter is more than `preempt_threshold` below a
  running client's, that client's newest request is pushed out to make room;
- the artifact's queue exactly (`vtc-artifact`): its lift, ties between equal counters
  going to the client seen first (its counters live in a dict in first-arrival order),
  and its charging quirk: whenever a request of the batch finishes, every request of
  that batch is charged one more output token.

The smallest waiting counter comes from a heap with one live entry per waiting
client, ordered by (counter, tie rank, push order). Counters mostly grow, so a stale entry (stored counter below the real one) is
re-pushed when it reaches the top; a counter that shrinks (a refund) pushes a fresh
entry and retires the old one. Each decision is O(log n) in the number of clients.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

from tokenfair.core.cost import CostFunction, LinearCost, prompt_cost
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.predictor import OutputLengthPredictor
from tokenfair.core.request import Request

LiftRule = Literal["paper", "artifact", "none"]


class ClientQueue:
    """One client's waiting requests in priority order (lower first), then arrival; a
    preempted request goes back ahead of its equals. Locality-aware VTC orders a
    client's requests otherwise (policies/locality.py)."""

    __slots__ = ("_requests",)

    def __init__(self) -> None:
        self._requests: deque[Request] = deque()

    def add(self, request: Request) -> None:
        queue = self._requests
        if queue and request.priority < queue[-1].priority:
            _insert_by_priority(queue, request, after_equals=True)
        else:
            queue.append(request)  # the usual case: arrival order

    def requeue(self, request: Request) -> None:
        queue = self._requests
        if queue and request.priority > queue[0].priority:
            _insert_by_priority(queue, request, after_equals=False)
        else:
            queue.appendleft(request)  # first among its equals: it was running

    def head(self) -> Request:
        return self._requests[0]

    def pop(self) -> Request:
        return self._requests.popleft()

    def remove(self, request: Request) -> bool:
        """Drop `request` if it waits here; whether it did."""
        if request not in self._requests:
            return False
        self._requests.remove(request)
        return True

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)


class VTCPolicy(Policy):
    charges_output = True

    def __init__(
        self,
        *,
        name: str = "vtc",
        weights: dict[str, float] | None = None,
        cost: CostFunction | None = None,
        lift: LiftRule = "paper",
        predictor: OutputLengthPredictor | None = None,
        preempt_threshold: float | None = None,
        ties_to_first_seen: bool = False,
        charge_batch_on_finish: bool = False,
    ):
        if lift not in ("paper", "artifact", "none"):
            raise ValueError(f"unknown lift rule {lift!r}: expected paper, artifact or none")
        for client, weight in (weights or {}).items():
            if not weight > 0:
                raise ValueError(f"weight of client {client!r} must be > 0, got {weight}")
        if preempt_threshold is not None and preempt_threshold < 0:
            raise ValueError(f"preemption threshold must be >= 0, got {preempt_threshold}")
        self.name = name
        self.weights = dict(weights or {})
        self.cost = cost or LinearCost()
        self._linear_w_out = self.cost.w_out if isinstance(self.cost, LinearCost) else None
        self.lift = lift
        self.predictor = predictor
        self.preempt_threshold = preempt_threshold
        self.ties_to_first_seen = ties_to_first_seen
        self.charges_batch_on_finish = charge_batch_on_finish
        self._counter: dict[str, float] = {}
        # Tie rank: the order clients were first seen, or 0 for all (ties then go to
        # the client whose heap entry is oldest: the one already waiting).
        self._rank: dict[str, int] = {}
        self._queues: dict[str, ClientQueue] = {}  # only clients with waiting requests
        # (counter when pushed, tie rank, seq, client)
        self._heap: list[tuple[float, int, int, str]] = []
        self._live_entry: dict[str, int] = {}  # client -> seq of its one valid heap entry
        self._seq = itertools.count()
        self._last_admitted: str | None = None
        self._num_waiting = 0

    # --- the smallest waiting counter ---
    def _push(self, client: str) -> None:
        seq = next(self._seq)
        self._live_entry[client] = seq
        heapq.heappush(self._heap, (self._counter[client], self._tie_rank(client), seq, client))
        if len(self._heap) > 2 * len(self._queues) + 64:
            self._compact()

    def _tie_rank(self, client: str) -> int:
        if not self.ties_to_first_seen:
            return 0
        return self._rank.setdefault(client, len(self._rank))

    def _compact(self) -> None:
        self._heap = [
            (self._counter[c], self._tie_rank(c), s, c) for c, s in self._live_entry.items()
        ]
        heapq.heapify(self._heap)

    def _min_client(self) -> str | None:
        heap, counter, live = self._heap, self._counter, self._live_entry
        while heap:
            stored, rank, seq, client = heap[0]
            if live.get(client) != seq:
                heapq.heappop(heap)  # retired entry
            elif stored != counter[client]:
                seq = next(self._seq)  # the counter grew since: re-file it
                live[client] = seq
                heapq.heapreplace(heap, (counter[client], rank, seq, client))
            else:
                return client
        return None

    def _lift(self, client: str) -> None:
        counter = self._counter.get(client, 0.0)
        if self.lift != "none":
            others = self._min_client()
            if others is not None:
                counter = max(counter, self._counter[others])
            elif self.lift == "paper" and self._last_admitted is not None:
                counter = max(counter, self._counter[self._last_admitted])
        self._counter[client] = counter

    # --- the waiting queue ---
    def _new_queue(self) -> ClientQueue:
        return ClientQueue()

    def add(self, request: Request, now: float) -> None:
        queue = self._queues.get(request.client)
        if self.ties_to_first_seen:
            self._tie_rank(request.client)  # seen at arrival, before its lift
        if queue is None:
            self._lift(request.client)
            queue = self._queues[request.client] = self._new_queue()
            self._push(request.client)
        queue.add(request)
        self._num_waiting += 1

    def requeue(self, request: Request) -> None:
        # A preempted request was being served, not idle: no lift.
        queue = self._queues.get(request.client)
        if queue is None:
            self._counter.setdefault(request.client, 0.0)
            queue = self._queues[request.client] = self._new_queue()
            self._push(request.client)
        queue.requeue(request)
        self._num_waiting += 1

    def _chosen_client(self) -> str | None:
        """The client whose request goes next: the smallest counter."""
        return self._min_client()

    def peek(self) -> Request | None:
        client = self._chosen_client()
        return None if client is None else self._queues[client].head()

    def pop(self) -> Request:
        client = self._chosen_client()
        if client is None:
            raise IndexError("pop from an empty waiting queue")
        queue = self._queues[client]
        request = queue.pop()
        if not queue:
            self._leave(client)
        self._num_waiting -= 1
        return request

    def remove(self, request: Request) -> None:
        queue = self._queues.get(request.client)
        if queue is None or not queue.remove(request):
            return
        self._num_waiting -= 1
        if not queue:
            self._leave(request.client)

    def _leave(self, client: str) -> None:
        del self._queues[client]
        del self._live_entry[client]  # its heap entry is retired lazily

    def __len__(self) -> int:
        return self._num_waiting

    def waiting_requests(self) -> Iterable[Request]:
        """Pop order with the counters as they are: _min_client's heap walk, on a copy
        (a re-filed entry takes a seq above every stored one, as a real re-file does)."""
        heap, counter, live = list(self._heap), self._counter, dict(self._live_entry)
        seq = itertools.count(max((entry[2] for entry in heap), default=0) + 1)
        while heap:
            stored, rank, entry_seq, client = heapq.heappop(heap)
            if live.get(client) != entry_seq:
                continue  # retired, or this client was listed already
            if stored != counter[client]:
                live[client] = next(seq)
                heapq.heappush(heap, (counter[client], rank, live[client], client))
                continue
            del live[client]
            yield from self._queues[client]

    # --- charges ---
    def _charge(self, client: str, amount: float) -> None:
        self._counter[client] += amount / self.weights.get(client, 1.0)

    def _chargeable_output(self, request: Request) -> int:
        return max(0, request.num_output_tokens - (0 if self.charge_first_token else 1))

    def on_admit(self, request: Request, first_time: bool, now: float) -> None:
        # The lift's reference is set here, not at pop: a caller may pop a request and
        # put it back when it does not fit (vLLM's scheduler does), which admits nobody.
        self._last_admitted = request.client
        self._counter.setdefault(request.client, 0.0)
        if first_time:
            # A re-admission after recompute is the system's doing: the prompt is paid once.
            self._charge(
                request.client,
                prompt_cost(
                    self.cost,
                    request.input_tokens,
                    request.cached_tokens,
                    self.charge_cached_tokens,
                ),
            )
        if self.predictor is not None:
            predicted = self.predictor.predict(request)
            if predicted > request.charged_output:
                self._charge_output(request, predicted)

    def _charge_output(self, request: Request, upto: int) -> None:
        amount = self.cost.output(request.input_tokens, request.charged_output, upto)
        self._charge(request.client, amount)
        request.charged_output = upto

    def on_output(self, request: Request) -> None:
        # Called for every running request on every step: the linear cost is inlined.
        produced = len(request.output_token_ids) - (0 if self.charge_first_token else 1)
        charged = request.charged_output
        if produced <= charged:
            return
        if self._linear_w_out is None:
            self._charge_output(request, produced)
            return
        client = request.client
        self._counter[client] += (
            self._linear_w_out * (produced - charged) / self.weights.get(client, 1.0)
        )
        request.charged_output = produced

    def on_finish(self, request: Request) -> None:
        if self.predictor is None:
            return
        self.predictor.observe(request)
        produced = self._chargeable_output(request)
        if request.charged_output > produced:  # refund the unused prediction
            self._charge_output(request, produced)
            if request.client in self._queues:
                self._push(request.client)  # its counter shrank: re-file it

    def on_batch_finish(self, batch: Sequence[Request]) -> None:
        # The artifact's quirk: one more output token's charge for the whole batch.
        for request in batch:
            n = request.num_output_tokens
            self._charge(request.client, self.cost.output(request.input_tokens, n - 1, n))

    def counters(self) -> dict[str, float]:
        return dict(self._counter)

    # --- preemption ---
    def victim_key(self, request: Request) -> tuple:
        """The newest request of the client with the largest counter goes first."""
        return (self._counter.get(request.client, 0.0), request.admit_seq)

    def preempt_for(self, head: Request, running: Sequence[Request]) -> Request | None:
        if self.preempt_threshold is None or not running:
            return None
        candidate = self.victim(running)
        gap = self._counter.get(candidate.client, 0.0) - self._counter.get(head.client, 0.0)
        return candidate if gap > self.preempt_threshold else None


def _insert_by_priority(queue: deque[Request], request: Request, after_equals: bool) -> None:
    """Insert into a queue kept in priority order: after the requests of the same
    priority (a new arrival), or before them (a preempted request going back)."""
    for index, other in enumerate(queue):
        if other.priority > request.priority or (
            not after_equals and other.priority == request.priority
        ):
            queue.insert(index, request)
            return
    queue.append(request)
