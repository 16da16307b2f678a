"""The policies the plugin runs inside vLLM, and how vLLM's own loop is set for each.

A `PluginPolicy` is a tokenfair `Policy` (it orders the waiting queue, charges
tenants, ranks victims) plus the two things the scheduler needs to know about it:

- `vllm_priority`: vLLM's loop runs in its own priority mode, which picks its
  victim itself (the lowest-priority running request) and keeps block-holding
  waiters in priority order; otherwise vLLM runs in FCFS mode and takes the tail
  of `running` as its victim;
- `sorts_running`: the scheduler keeps `running` sorted by the policy's
  `victim_key` before each step, so that FCFS tail is the policy's victim;
- `prefix_cache`: the policy orders by what the engine's prefix cache holds (its
  `Needs.prefix_cache`), so it is given the scheduler's view of vLLM's.

`fcfs` and `priority` are vLLM's own orders, exactly: one tenant's requests are
scheduled as stock vLLM schedules them, so vLLM's own scheduler tests pass with the
plugin. (tokenfair's core `fcfs` orders preempted requests among themselves by
arrival and its `priority` puts them ahead of their equals; vLLM puts the last one
pushed back first, and orders its priority queue by priority, arrival and request id
only.) The other policies are tokenfair's core ones, with `running` in victim order.

A policy runs here when its declaration says so (`Needs.vllm`, core/policies/
declaration.py): a new one needs no line here unless vLLM has its own form of it, as
for `fcfs` and `priority` in `plugin_policy`. The ones that
order by what the engine already holds (`vtc-lpm`, `dlpm`, `vtc-hit`: they declare
`prefix_cache`) get the scheduler's view of vLLM's prefix cache (prefix_cache.py) at
construction. A user's policy class (`mypkg.mod:MyPolicy`) runs as the core's own do:
vLLM's FCFS mode, `running` in its victim order, and the prefix cache's view if it
declares `needs = Needs(prefix_cache=True)` (or overrides `attach_prefix_cache`).

No vLLM import here: plain Python over tokenfair's core, like the driver.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from tokenfair.core.policies import Policy
from tokenfair.core.policies.base import KeyedPolicy
from tokenfair.core.policies.view import RequestView


@dataclass(frozen=True, slots=True)
class PluginPolicy:
    policy: Policy
    vllm_priority: bool = False
    sorts_running: bool = True
    prefix_cache: bool = False


class VllmFCFS(Policy):
    """vLLM's FCFS queue: arrivals at the back, a request put back at the very front."""

    name = "fcfs"

    def __init__(self) -> None:
        self._queue: deque[RequestView] = deque()

    def add(self, request: RequestView, now: float) -> None:
        self._queue.append(request)

    def requeue(self, request: RequestView) -> None:
        self._queue.appendleft(request)

    def peek(self) -> RequestView | None:
        return self._queue[0] if self._queue else None

    def pop(self) -> RequestView:
        return self._queue.popleft()

    def remove(self, request: RequestView) -> None:
        if request in self._queue:
            self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def waiting_requests(self) -> Iterable[RequestView]:
        return list(self._queue)


class VllmPriority(KeyedPolicy):
    """vLLM's priority queue: (priority, arrival, request id), put-backs included.

    The victim is vLLM's own choice in its priority mode; `victim_key` ranks the same
    way (the largest priority value, then the latest arrival) for the status line.
    """

    name = "priority"

    def sort_key(self, request: RequestView, band: int) -> tuple:
        return (request.priority, request.arrival_s, request.request_id)

    def victim_key(self, request: RequestView) -> tuple:
        return (request.priority, request.arrival_s)


def plugin_policy(name: str, policy: Policy) -> PluginPolicy:
    """The plugin's form of the policy `name` (already validated) built as `policy`."""
    if name == "fcfs":
        return PluginPolicy(VllmFCFS(), sorts_running=False)
    if name == "priority":
        return PluginPolicy(VllmPriority(), vllm_priority=True, sorts_running=False)
    return PluginPolicy(policy, prefix_cache=policy.needs.prefix_cache)
