"""The policy seam: who waits in what order, who pays, and who is pushed out.

A policy owns the waiting queue. The driver (the scheduler, the vLLM plugin, the
gateway) asks it for the next request to admit (`peek`/`pop`), tells it about
admissions and generated tokens so it can charge clients, and asks it to pick a victim
when memory runs out. A policy sees requests only through `RequestView` (view.py),
never the engine's state; it never sees the clock except through the `now` arguments
it is given. The contract, hook by hook, is in docs/policies.md.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence

from tokenfair.core.policies.needs import Needs
from tokenfair.core.policies.view import RequestView
from tokenfair.core.prefix_cache import PrefixCache
from tokenfair.core.share_tree import ShareTree


class Policy:
    """Base policy: subclasses define the waiting order; the rest has sane defaults."""

    name = "base"
    # What it needs from its driver and which drivers run it (declaration.py). The
    # built-in names declare theirs in their modules; a class of one's own sets this.
    needs = Needs()
    # True when on_output must be called as tokens are generated (counter policies).
    charges_output = False
    # True when on_batch_finish must be called (the paper artifact's charging quirk).
    charges_batch_on_finish = False

    # --- the waiting queue ---
    def add(self, request: RequestView, now: float) -> None:
        """A new arrival joins the waiting queue."""
        raise NotImplementedError

    def requeue(self, request: RequestView) -> None:
        """A preempted (recompute) request waits again, ahead of its client's others."""
        raise NotImplementedError

    def peek(self) -> RequestView | None:
        """The request to admit next, or None when nobody waits."""
        raise NotImplementedError

    def pop(self) -> RequestView:
        """Remove and return the request `peek` returned."""
        raise NotImplementedError

    def remove(self, request: RequestView) -> None:
        """Drop a waiting request (aborted)."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def waiting_requests(self) -> Iterable[RequestView]:
        """Every waiting request, in the order successive pops would return them
        (with no admission, and so no charge, in between)."""
        raise NotImplementedError

    def waiting_heads(self) -> Iterable[RequestView]:
        """Each tenant's first waiting request, in the order of `waiting_requests` (the
        request a tenant would send next). By default read off `waiting_requests`; a
        policy keeping a queue per tenant answers without walking every request."""
        seen: set[str] = set()
        for request in self.waiting_requests():
            if request.client not in seen:
                seen.add(request.client)
                yield request

    def waiting_tenants(self) -> Iterable[str]:
        """The tenants with a request waiting (any order). By default read off
        `waiting_requests`; a policy keeping a queue per tenant says it directly."""
        return {request.client for request in self.waiting_requests()}

    # --- arrivals, charges, finishes ---
    def accept(self, request: RequestView, now: float) -> bool:
        """False rejects the request at arrival (rate limits)."""
        return True

    def attach_prefix_cache(self, cache: PrefixCache) -> None:
        """The scheduler's prefix cache, for policies that order by what it holds."""

    def on_admit(self, request: RequestView, first_time: bool, now: float) -> None:
        """`request` left the waiting queue for the batch (`request.cached_tokens` of
        its prompt were found in the prefix cache at its first admission)."""

    def on_output(self, request: RequestView, new_tokens: int) -> None:
        """`request` generated `new_tokens` more output tokens (its `num_output_tokens`
        counts them already). Called only if `charges_output`."""

    def on_finish(self, request: RequestView) -> None:
        """`request` left the system (finished or aborted while admitted)."""

    def on_batch_finish(self, batch: Sequence[RequestView]) -> None:
        """Some request of this step's batch finished; `batch` is every request the
        step ran, the finished ones included. Called only if charges_batch_on_finish."""

    # --- what contention asks of it (core/contention.py decides) ---
    # Whether what tenants hold (seats, KV memory) is shared among them by weight when
    # a waiting request needs it (the VTC family); False keeps a running request's
    # seat and memory until it finishes, as vLLM does (fcfs, priority).
    shares_by_weight = False

    def weight_of(self, client: str) -> float:
        """The client's weight in every share (1 unless the policy keeps weights)."""
        return 1.0

    def victim_key(self, request: RequestView) -> tuple:
        """The policy's order among running requests to push out, other things equal:
        the largest key goes first. By default the newest admission.

        Drivers that keep their own running list (the vLLM plugin) sort it by this key
        (behind what each tenant holds, when memory is shared) so the engine's own
        victim is ours.
        """
        return (request.admit_seq,)

    def preempts_for(self, head: RequestView, candidate: RequestView) -> bool:
        """Whether `candidate`, the running request the contention rules would push out
        for `head` (which cannot start), goes now for the policy's own reason: a
        fairness preemption (vtc-preempt's counter gap) or importance (priority). By
        default never."""
        return False

    def counters(self) -> dict[str, float]:
        """Per-client virtual counters, for policies that keep them."""
        return {}

    def node_counters(self) -> dict[str, float]:
        """Every node's counter, groups (`@path`) as well as clients; by default the
        clients' (`counters`)."""
        return self.counters()

    def weights_in_use(self) -> dict[str, float]:
        """The weights it orders by now (tenants, and groups as `@path`), for metrics and
        status pages; by default a `weights` mapping it keeps (docs/policies.md asks a
        policy of one's own to keep `settings.weights` so), or none."""
        return dict(getattr(self, "weights", None) or {})

    def reweigh(self, weights: Mapping[str, float], tree: ShareTree | None = None) -> None:
        """New weights while running (tenants by name, groups as `@path`; the others keep
        theirs) and, after a tenants file is reloaded, its tree (new tenants and groups,
        nobody moved). Takes effect at the next decision. Default: ignored (a policy
        without weights)."""


class OrderedQueue:
    """A waiting queue ordered by a sort key, with O(log n) push/pop and lazy removal."""

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[tuple, int, RequestView]] = []
        self._live: dict[str, RequestView] = {}
        self._seq = itertools.count()

    def push(self, key: tuple, request: RequestView) -> None:
        heapq.heappush(self._heap, (key, next(self._seq), request))
        self._live[request.request_id] = request

    def _drop_dead(self) -> None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][2].request_id) is not heap[0][2]:
            heapq.heappop(heap)

    def peek(self) -> RequestView | None:
        self._drop_dead()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> RequestView:
        self._drop_dead()
        request = heapq.heappop(self._heap)[2]
        del self._live[request.request_id]
        return request

    def remove(self, request: RequestView) -> None:
        self._live.pop(request.request_id, None)
        # Entries are dropped lazily; compact when the dead ones dominate.
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._live):
            self._heap = [e for e in self._heap if self._live.get(e[2].request_id) is e[2]]
            heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._live)

    def clients(self) -> set[str]:
        """The clients of the live requests (no sorting)."""
        return {request.client for request in self._live.values()}

    def __iter__(self) -> Iterator[RequestView]:
        """The live requests in pop order (a sorted copy: O(n log n))."""
        live, seen = self._live, set()
        for _, _, request in sorted(e for e in self._heap if live.get(e[2].request_id) is e[2]):
            if request.request_id not in seen:  # pop would take an earlier entry only
                seen.add(request.request_id)
                yield request


class KeyedPolicy(Policy):
    """A policy whose waiting order is a static sort key per request.

    `band` is 0 for a preempted request and 1 for a new one: placed first in the key,
    preempted requests go back ahead of every new arrival (vLLM prepends them).
    """

    def __init__(self) -> None:
        self._queue = OrderedQueue()

    def sort_key(self, request: RequestView, band: int) -> tuple:
        raise NotImplementedError

    def add(self, request: RequestView, now: float) -> None:
        self._queue.push(self.sort_key(request, 1), request)

    def requeue(self, request: RequestView) -> None:
        self._queue.push(self.sort_key(request, 0), request)

    def peek(self) -> RequestView | None:
        return self._queue.peek()

    def pop(self) -> RequestView:
        return self._queue.pop()

    def remove(self, request: RequestView) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def waiting_requests(self) -> Iterable[RequestView]:
        return iter(self._queue)

    def waiting_tenants(self) -> Iterable[str]:
        return self._queue.clients()
