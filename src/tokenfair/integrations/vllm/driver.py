"""The bookkeeping between vLLM's scheduler and a tokenfair policy (no vLLM imports).

A tokenfair policy orders, charges and picks victims among requests it sees through
the narrow view (core/policies/view.py). For every vLLM request the driver keeps a
shadow `PolicyRequest` (tenant, prompt length, priority, cached prompt tokens, output
tokens so far) next to the vLLM object it stands for, the handle, and turns the
scheduler's events into the policy's calls:

    arrive      a new request joins the waiting queue          policy.add (the lift)
    pop         vLLM's schedule() takes the head               policy.pop
    put_back    it did not fit, or was preempted: it waits     policy.requeue (no lift)
                again at the front of its tenant's queue
    started     it is running (seen after schedule())          policy.on_admit: the
                                                               prompt, first start only
    produced    its output token count after a step            policy.on_output
    finished    stopped, length-capped or aborted              policy.remove / on_finish

Charging on `started` rather than on `pop` is what keeps a request that vLLM pops and
puts back in the same step (it did not fit) from being charged, and `ever_admitted`
keeps a re-prefill after preemption from paying its prompt twice.

A request whose first N prompt tokens come from the prefix cache starts with
`cached_tokens = N`; the policy prices them at its `charge_cached_tokens` share.
Output is reported as a count, which is all a policy reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from tokenfair.core.contention import holding_key
from tokenfair.core.policies import Policy
from tokenfair.core.policies.starts import Starts
from tokenfair.core.policies.view import PolicyRequest, RequestView
from tokenfair.core.request import FinishReason

H = TypeVar("H")


@dataclass(slots=True)
class TenantStats:
    """What one tenant asked for and received, as this engine core saw it."""

    requests: int = 0  # arrivals
    prompt_tokens: int = 0  # prompt tokens charged at first start
    cached_prompt_tokens: int = 0  # of those starts, tokens found in the prefix cache
    output_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    waiting: int = 0  # now, in the fair queue
    running: int = 0  # now


@dataclass(slots=True, eq=False)
class _Entry(Generic[H]):
    shadow: PolicyRequest
    handle: H
    queued: bool = False  # in the policy's waiting queue
    running: bool = False  # started and not preempted or finished since


class PolicyDriver(Generic[H]):
    def __init__(self, policy: Policy):
        self.policy = policy
        self._entries: dict[str, _Entry[H]] = {}
        self._tenants: dict[str, TenantStats] = {}
        self._starts = Starts(policy)  # tells the policy each start, numbered
        # Tenants whose waiting requests go after the other tenants' in this step (the
        # memory share: integrations/vllm/memory_share.py); else the policy's order.
        self.aside: frozenset[str] = frozenset()

    # --- arrivals and the waiting queue ---
    def arrive(
        self,
        request_id: str,
        handle: H,
        *,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        priority: int = 0,
        arrival_s: float = 0.0,
        predicted_output_tokens: int | None = None,
        queue: bool = True,
    ) -> None:
        """A request joins the fair queue (`queue=False`: vLLM keeps it elsewhere).

        A request the driver already knows (a streaming-input session's next turn)
        goes back to the front of its tenant's queue: it was being served, not idle.
        """
        entry = self._entries.get(request_id)
        if entry is not None:
            entry.handle = handle
            self._stop_running(entry)
            if queue and not entry.queued:
                self._enqueue(entry, front=True)
            return
        shadow = PolicyRequest(
            request_id,
            tenant,
            max(1, prompt_tokens),
            arrival_s,
            max_tokens=max(1, max_tokens),
            priority=priority,
            predicted_output_tokens=predicted_output_tokens,
        )
        entry = _Entry(shadow, handle)
        self._entries[request_id] = entry
        self._stats(tenant).requests += 1
        if queue:
            self._enqueue(entry, front=False)

    def _stats(self, tenant: str) -> TenantStats:
        stats = self._tenants.get(tenant)
        if stats is None:
            stats = self._tenants[tenant] = TenantStats()
        return stats

    def _enqueue(self, entry: _Entry[H], *, front: bool) -> None:
        shadow = entry.shadow
        if front:
            self.policy.requeue(shadow)
        else:
            self.policy.add(shadow, shadow.arrival_s)
        entry.queued = True
        self._stats(shadow.client).waiting += 1

    def _stop_running(self, entry: _Entry[H]) -> None:
        if entry.running:
            entry.running = False
            self._stats(entry.shadow.client).running -= 1

    def next_view(self) -> RequestView | None:
        """The policy's head, unless its tenant is set aside: then the first waiting
        request of a tenant that is not (the head when all are)."""
        head = self.policy.peek()
        if head is None or head.client not in self.aside:
            return head
        for shadow in self.policy.waiting_requests():
            if shadow.client not in self.aside:
                return shadow
        return head

    def peek(self) -> H | None:
        shadow = self.next_view()
        return None if shadow is None else self._entries[shadow.request_id].handle

    def pop(self) -> H:
        """Take the next request of the fair queue (IndexError when empty); nothing is
        charged."""
        shadow = self.next_view()
        if shadow is None:
            raise IndexError("pop from an empty waiting queue")
        if shadow is self.policy.peek():
            self.policy.pop()
        else:
            self.policy.remove(shadow)  # behind the head of a tenant set aside
        entry = self._entries[shadow.request_id]
        entry.queued = False
        self._stats(shadow.client).waiting -= 1
        return entry.handle

    def put_back(self, request_id: str) -> bool:
        """The request waits again at the front of its tenant's queue.

        Returns True when this was a preemption (it had started), False when it was
        popped and not admitted. Either way no lift and no charge.
        """
        entry = self._entries.get(request_id)
        if entry is None or entry.queued:
            return False
        preempted = entry.running
        if preempted:
            self._stop_running(entry)
            self._stats(entry.shadow.client).preemptions += 1
        self._enqueue(entry, front=True)
        return preempted

    def remove(self, request_id: str) -> None:
        """Take a request out of the fair queue, if it is there (it keeps its entry)."""
        entry = self._entries.get(request_id)
        if entry is not None and entry.queued:
            self.policy.remove(entry.shadow)
            entry.queued = False
            self._stats(entry.shadow.client).waiting -= 1

    def __len__(self) -> int:
        return len(self.policy)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def waiting(self) -> Iterator[H]:
        entries = self._entries
        for shadow in list(self.policy.waiting_requests()):
            yield entries[shadow.request_id].handle

    # --- the lifecycle after each step ---
    def started(self, request_id: str, cached_tokens: int = 0, now: float = 0.0) -> None:
        """The request is running now; its first start pays the prompt."""
        entry = self._entries.get(request_id)
        if entry is None or entry.running:
            return
        if entry.queued:  # vLLM admitted it without popping (never in 0.32): dequeue
            self.remove(request_id)
        shadow = entry.shadow
        stats = self._stats(shadow.client)
        entry.running = True
        stats.running += 1
        cached = max(0, min(cached_tokens, shadow.input_tokens - 1))
        if self._starts.start(shadow, cached, now):  # its first: the prompt is paid
            stats.prompt_tokens += shadow.input_tokens
            stats.cached_prompt_tokens += cached

    def produced(self, request_id: str, num_output_tokens: int) -> None:
        """The request has `num_output_tokens` output tokens now; charge the new ones."""
        entry = self._entries.get(request_id)
        if entry is None:
            return
        shadow = entry.shadow
        new = num_output_tokens - shadow.num_output_tokens
        if new <= 0:
            return
        shadow.num_output_tokens = num_output_tokens
        self._stats(shadow.client).output_tokens += new
        if self.policy.charges_output:
            self.policy.on_output(shadow, new)

    def finished(self, request_id: str, num_output_tokens: int, reason: FinishReason) -> None:
        """The request left vLLM: charge its last tokens, then let the policy settle."""
        entry = self._entries.get(request_id)
        if entry is None:
            return
        self.produced(request_id, num_output_tokens)
        self.remove(request_id)
        self._stop_running(entry)
        del self._entries[request_id]
        shadow = entry.shadow
        shadow.finish_reason = reason
        self._stats(shadow.client).finished += 1
        if shadow.ever_admitted:
            self.policy.on_finish(shadow)  # predictors learn, predictions are refunded

    def view(self, request_id: str) -> PolicyRequest:
        """What the policy sees of a request the driver knows."""
        return self._entries[request_id].shadow

    def vllm_request(self, request_id: str) -> H:
        """The vLLM request a shadow stands for."""
        return self._entries[request_id].handle

    # --- preemption order and views ---
    def victim_key(self, request_id: str) -> tuple:
        """The policy's preemption order: the largest key is pushed out first."""
        entry = self._entries.get(request_id)
        return (float("-inf"),) if entry is None else self.policy.victim_key(entry.shadow)

    def holding_victim_key(self, request_id: str, holdings: Mapping[str, int]) -> tuple:
        """The policy's preemption order knowing the KV blocks each tenant holds."""
        entry = self._entries.get(request_id)
        if entry is None:
            return (float("-inf"),)
        return holding_key(self.policy, entry.shadow, holdings)

    def tenant_of(self, request_id: str) -> str | None:
        entry = self._entries.get(request_id)
        return None if entry is None else entry.shadow.client

    def counters(self) -> dict[str, float]:
        """Each tenant's virtual counter (empty for policies without counters)."""
        return self.policy.counters()

    def tenants(self) -> dict[str, TenantStats]:
        """A copy of every tenant's statistics (safe to read from another thread)."""
        return {tenant: replace(stats) for tenant, stats in list(self._tenants.items())}
