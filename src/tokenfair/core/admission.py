"""Admission, step 3 of a scheduler step (scheduler.py): which waiting requests start.

Waiting requests are tried in policy order under max_num_seqs, the step's token budget
(prefills may be chunked, and shared among tenants: step_share.py) and memory; the
head's cached prefix is looked up first and taken only with its admission. The first
request that does not fit stops admission (no skipping ahead), unless someone's seat or
memory goes to it, or its tenant is over its share of the pool and steps aside
(holding_share.py), when the next tenant's request is tried.
"""

from __future__ import annotations

from collections import deque
from typing import Literal, Protocol

from tokenfair.core.batch import ScheduledRequest, SchedulerOutput
from tokenfair.core.holding_share import HoldingShare
from tokenfair.core.kv_cache import KVCacheManager, PrefixHit
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.starts import Starts
from tokenfair.core.policies.view import RequestView
from tokenfair.core.request import Request, RequestStatus
from tokenfair.core.reserve import reserve_peak_fits
from tokenfair.core.scheduler_config import SchedulerConfig
from tokenfair.core.step_share import StepShare


class Host(Protocol):
    """What admission uses of its scheduler: the pool, the running and swapped
    requests, and pushing a request out."""

    config: SchedulerConfig
    policy: Policy
    kv: KVCacheManager
    running: list[Request]
    swapped: deque[Request]

    def own(self, request: RequestView) -> Request: ...

    def plan_chunk(self, remaining: int, budget: int) -> int: ...

    def unschedule(self, request: Request, out: SchedulerOutput) -> int: ...

    def preempt(
        self,
        victim: Request,
        out: SchedulerOutput,
        mode: str | None = None,
        cause: Literal["memory", "policy", "operator"] = "memory",
    ) -> None: ...


class Admission:
    def __init__(self, host: Host, step_share: StepShare | None, holding: HoldingShare) -> None:
        self.host = host
        self.step_share = step_share  # None: the step's budget is not shared
        self.holding = holding  # what a blocked head may take of what others hold
        self.starts = Starts(host.policy)  # tells the policy each start, numbered
        self.stepped_aside: frozenset[str] = frozenset()  # in the last admission

    def admit(self, out: SchedulerOutput, budget: int, now: float) -> int:
        """Admit waiting requests in policy order; return how many were admitted."""
        host = self.host
        if host.swapped:
            return 0  # swapped requests come back before anyone new is let in
        admitted = 0
        aside: set[str] = set()  # tenants whose head stepped aside (memory or step share)
        while budget > 0:
            waiting, first_in_line = self.holding.next_candidate(aside)
            if waiting is None:
                break
            head = host.own(waiting)
            # Its cached prefix, looked up (nothing taken): plan as if it were computed.
            hit = host.kv.lookup_prefix(head)
            if not (first_in_line or self.holding.may_pass(head, hit, host.running, aside)):
                continue
            planned = self._plan(head, hit, budget, out)
            if planned is None:  # its tenant had its share of this step: another may start
                aside.add(head.client)
                continue
            n, unshared = planned
            table = self._allocate(head, hit, n, unshared)
            if table is None:
                made_room = self._make_room(head, hit, n, admitted, out, aside)
                if made_room is None:
                    break
                budget += made_room
                continue
            budget -= n
            self._start(head, hit, n, table, first_in_line, out, now)
            admitted += 1
        if self.step_share is not None:
            if admitted:
                self.step_share.cut_for_newcomers(out.scheduled)
            self.step_share.top_up(out.scheduled, budget, host.kv.allocate)
        self.stepped_aside = frozenset(aside) if aside else frozenset()  # (a singleton)
        return admitted

    def _plan(
        self, head: Request, hit: PrefixHit, budget: int, out: SchedulerOutput
    ) -> tuple[int, int] | None:
        """The tokens `head` would run in this step, and those its blocks must hold (a
        shared prompt must not run short halfway); None when its tenant had its share
        of the step."""
        remaining = head.num_tokens - hit.num_tokens
        n = self.host.plan_chunk(remaining, budget)
        if n == 0 and not out.scheduled:
            n = remaining  # too big for the budget and chunking is off: alone, not never
        unshared = n
        if n > 1 and self.step_share is not None:
            n = self.step_share.allow(head.client, n, starts=n == remaining)
            if n == 0:
                return None
        return n, unshared

    def _allocate(self, head: Request, hit: PrefixHit, n: int, unshared: int) -> list[int] | None:
        """Its block table when it fits (a seat, the reserve check, the blocks); None."""
        host = self.host
        config = host.config
        if n <= 0 or len(host.running) >= config.max_num_seqs:
            return None
        if config.admission == "reserve" and not reserve_peak_fits(
            [*host.running, head], host.kv, config
        ):
            return None
        # Last: takes the prefix and the new blocks if they all fit, else nothing.
        return host.kv.allocate(head, hit.num_tokens + unshared, hit)

    def _make_room(
        self,
        head: Request,
        hit: PrefixHit,
        n: int,
        admitted: int,
        out: SchedulerOutput,
        aside: set[str],
    ) -> int | None:
        """`head` does not fit: push out the victim its seat or memory comes from (the
        tokens it gives back to the budget), or let its tenant step aside (0); None:
        admission stops here."""
        host = self.host
        # It is next in line: its idle cached blocks become the most recently used, so
        # evicted last (docs/experiments.md's locality numbers have it).
        host.kv.touch_prefix(hit)
        # Never push out a request admitted in this step (the tail of `running`).
        settled = host.running[:-admitted] if admitted else host.running
        chosen = self.holding.victim(head, hit, settled, len(host.running)) if n else None
        if chosen is not None:
            victim = host.own(chosen)
            returned = host.unschedule(victim, out)  # its tokens in this step
            host.preempt(victim, out, mode="recompute", cause="policy")
            if self.holding.took_memory:
                aside.add(victim.client)  # it gave way: it does not take it back now
            return returned
        if (
            n
            and len(host.running) < host.config.max_num_seqs
            and self.holding.steps_aside(head, hit, host.running)
        ):
            aside.add(head.client)
            return 0
        return None

    def _start(
        self,
        head: Request,
        hit: PrefixHit,
        n: int,
        table: list[int],
        first_in_line: bool,
        out: SchedulerOutput,
        now: float,
    ) -> None:
        """`head` runs from this step: out of the queue, charged, in the batch."""
        host = self.host
        policy = host.policy
        computed = hit.num_tokens
        head.num_computed_tokens = computed
        if first_in_line:
            policy.pop()
        else:
            policy.remove(head)  # a request behind the head of the queue
        host.kv.count_prefix_query(computed, head.num_tokens)
        head.status = RequestStatus.RUNNING
        if head.scheduled_s is None:
            head.scheduled_s = now
        host.running.append(head)
        self.starts.start(head, computed, now)
        out.scheduled.append(ScheduledRequest(head, n, computed, table))
        if self.step_share is not None:
            self.step_share.admitted(head, n, computed + n == head.num_tokens)
