"""A served policy that cannot take the server down with it.

The server runs the operator's policy, possibly a class of their own, on its engine's
scheduling thread. A hook that raises there would end the engine: every request in
flight aborted, every later one refused. `GuardedPolicy` wraps the policy instead:

- while the policy works, every hook is the policy's own, unchanged;
- the first exception raised by any hook switches the scheduler to `fcfs` for the rest
  of the process: the requests waiting then are handed to it in arrival order (those
  that were preempted ahead of the others, as a preempted request goes back), the
  hook's call is answered by `fcfs`, and every later call goes to `fcfs` alone;
- the failure is one log line (ERROR) naming the policy, the hook and the exception
  (the traceback at DEBUG), and `status()` reports it (/health, the
  `tokenfair:policy_failures` metric);
- requests already running go on: only who is admitted next, and who is charged, is
  now `fcfs`'s (it charges nobody).

The simulator and the experiments do not wrap their policies: there a policy's bug
fails the run, naming the hook (experiments/runner.py).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.core.policies.view import RequestView
from tokenfair.core.prefix_cache import PrefixCache
from tokenfair.core.share_tree import ShareTree

log = logging.getLogger(__name__)

FALLBACK = "fcfs"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PolicyFailure:
    """The hook that raised first, and what it raised."""

    hook: str
    error: str  # "TypeName: message"


class GuardedPolicy(Policy):
    """`policy`, replaced by `fcfs` for good at the first exception of any hook."""

    def __init__(self, policy: Policy) -> None:
        self.inner = policy
        self.name = policy.name
        self.needs = policy.needs
        self.charges_output = policy.charges_output
        self.charges_batch_on_finish = policy.charges_batch_on_finish
        self.failure: PolicyFailure | None = None
        self._fallback: Policy | None = None
        self._cache: PrefixCache | None = None
        # What waits, as the driver told the policy: request id -> (arrival rank,
        # preempted, request), to hand to the fallback should the policy fail.
        self._waiting: dict[str, tuple[int, bool, RequestView]] = {}
        self._rank = itertools.count()
        self._peeked: RequestView | None = None
        self._now = 0.0

    # --- the failure ---
    @property
    def active(self) -> Policy:
        """The policy deciding now: the wrapped one, or the fallback after a failure."""
        return self.inner if self._fallback is None else self._fallback

    def status(self) -> dict[str, Any]:
        """The policy's name and state, as /health reports it."""
        status: dict[str, Any] = {"name": self.name, "failed": self.failure is not None}
        if self.failure is not None:
            status.update(hook=self.failure.hook, error=self.failure.error, fallback=FALLBACK)
        return status

    @property
    def failures(self) -> int:
        """How many times the policy failed (0 or 1: after one it no longer runs)."""
        return 0 if self.failure is None else 1

    def _fail(self, hook: str, error: Exception) -> Policy:
        """Switch to the fallback (once); return it."""
        if self._fallback is not None:
            return self._fallback
        self.failure = PolicyFailure(hook, f"{type(error).__name__}: {error}")
        fallback = FCFSPolicy()
        if self._cache is not None:
            fallback.attach_prefix_cache(self._cache)
        waiting = sorted(self._waiting.values(), key=lambda entry: entry[0])
        for _, preempted, request in waiting:
            if preempted:
                fallback.requeue(request)
            else:
                fallback.add(request, self._now)
        self._fallback = fallback
        self.charges_output = fallback.charges_output
        self.charges_batch_on_finish = fallback.charges_batch_on_finish
        log.error(
            "policy %r failed in its hook %s (%s); scheduling goes on with %s (first "
            "come, first served) for the rest of this process, %d waiting request(s) "
            "carried over in arrival order",
            self.name,
            hook,
            self.failure.error,
            FALLBACK,
            len(waiting),
        )
        log.debug("policy %r: the exception in %s", self.name, hook, exc_info=error)
        return fallback

    def _guard(self, hook: str, call: Callable[[Policy], T]) -> T:
        """`call(policy)`, on the fallback instead once the policy has failed."""
        if self._fallback is None:
            try:
                return call(self.inner)
            except Exception as error:  # a bug in the policy: it is not run again
                return call(self._fail(hook, error))
        return call(self._fallback)

    # --- the waiting queue ---
    def accept(self, request: RequestView, now: float) -> bool:
        self._now = now
        return self._guard("accept", lambda policy: policy.accept(request, now))

    def add(self, request: RequestView, now: float) -> None:
        self._now = now
        self._peeked = None
        self._waiting[request.request_id] = (next(self._rank), False, request)
        self._guard("add", lambda policy: policy.add(request, now))

    def requeue(self, request: RequestView) -> None:
        self._peeked = None
        self._waiting[request.request_id] = (next(self._rank), True, request)
        self._guard("requeue", lambda policy: policy.requeue(request))

    def peek(self) -> RequestView | None:
        self._peeked = self._guard("peek", lambda policy: policy.peek())
        return self._peeked

    def pop(self) -> RequestView:
        peeked = self._peeked
        self._peeked = None
        if self._fallback is None:
            try:
                request = self.inner.pop()
            except Exception as error:
                fallback = self._fail("pop", error)
                if peeked is not None and peeked.request_id in self._waiting:
                    fallback.remove(peeked)  # the driver takes what it was shown
                    request = peeked
                else:
                    request = fallback.pop()
        else:
            request = self._fallback.pop()
        self._waiting.pop(request.request_id, None)
        return request

    def remove(self, request: RequestView) -> None:
        self._peeked = None
        self._waiting.pop(request.request_id, None)
        self._guard("remove", lambda policy: policy.remove(request))

    def __len__(self) -> int:
        return self._guard("__len__", len)

    def waiting_requests(self) -> Iterable[RequestView]:
        return self._iterate("waiting_requests", lambda policy: policy.waiting_requests())

    def waiting_heads(self) -> Iterable[RequestView]:
        return self._iterate("waiting_heads", lambda policy: policy.waiting_heads())

    def waiting_tenants(self) -> Iterable[str]:
        return self._iterate("waiting_tenants", lambda policy: policy.waiting_tenants())

    def _iterate(self, hook: str, call: Callable[[Policy], Iterable[T]]) -> Iterable[T]:
        """`call(policy)`'s items, on the fallback instead once the policy has failed,
        whether it fails when called or while its items are read."""
        if self._fallback is None:
            try:
                return self._guarded_iteration(hook, call(self.inner))
            except Exception as error:
                return call(self._fail(hook, error))
        return call(self._fallback)

    def _guarded_iteration(self, hook: str, items: Iterable[T]) -> Iterator[T]:
        """`items`, lazily (a caller may stop early); an exception while iterating ends
        the iteration and switches to the fallback."""
        iterator = iter(items)
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                return
            except Exception as error:
                self._fail(hook, error)
                return
            yield item

    def attach_prefix_cache(self, cache: PrefixCache) -> None:
        self._cache = cache
        self._guard("attach_prefix_cache", lambda policy: policy.attach_prefix_cache(cache))

    # --- charges ---
    def on_admit(self, request: RequestView, first_time: bool, now: float) -> None:
        self._now = now
        self._guard("on_admit", lambda policy: policy.on_admit(request, first_time, now))

    def on_output(self, request: RequestView, new_tokens: int) -> None:
        self._guard("on_output", lambda policy: policy.on_output(request, new_tokens))

    def on_finish(self, request: RequestView) -> None:
        self._guard("on_finish", lambda policy: policy.on_finish(request))

    def on_batch_finish(self, batch: Sequence[RequestView]) -> None:
        self._guard("on_batch_finish", lambda policy: policy.on_batch_finish(batch))

    # --- what contention asks ---
    @property
    def shares_by_weight(self) -> bool:  # type: ignore[override]
        active = self.inner if self._fallback is None else self._fallback
        return active.shares_by_weight

    def weight_of(self, client: str) -> float:
        return self._guard("weight_of", lambda policy: policy.weight_of(client))

    def victim_key(self, request: RequestView) -> tuple:
        return self._guard("victim_key", lambda policy: policy.victim_key(request))

    def preempts_for(self, head: RequestView, candidate: RequestView) -> bool:
        return self._guard("preempts_for", lambda policy: policy.preempts_for(head, candidate))

    # --- what the server reads and sets ---
    def counters(self) -> dict[str, float]:
        return self._guard("counters", lambda policy: policy.counters())

    def node_counters(self) -> dict[str, float]:
        return self._guard("node_counters", lambda policy: policy.node_counters())

    def weights_in_use(self) -> dict[str, float]:
        return self._guard("weights_in_use", lambda policy: policy.weights_in_use())

    def reweigh(self, weights: Mapping[str, float], tree: ShareTree | None = None) -> None:
        self._guard("reweigh", lambda policy: policy.reweigh(weights, tree))
