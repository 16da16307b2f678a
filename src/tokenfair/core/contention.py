"""Contention: who gives up what to whom when a request cannot have what it needs.

A tenant holds three things a waiting request may need: seats of the batch, KV blocks
of the pool, and tokens of the step. One rule decides every case, by weight:

    a tenant is guaranteed its entitlement (the resource x its weight / the weights
    present); what is spare goes first to the tenants within their max-min share;
    only a tenant over its share gives anything up, and only to one within its own.

For each resource (the arithmetic is in memory_share.py, batch_share.py and
step_share.py, and docs/fairness.md gives the figures behind each choice):
- **memory, running short**: the victim is the newest request of the tenant holding
  the most blocks per unit of weight, then the policy's own order (`victim_key`).
- **memory, at admission**: a head within its entitlement takes the memory of the
  tenant furthest over its own (the newest request; never so far that the two change
  places); a head that cannot start, whatever its tenant holds, lets the requests of
  tenants within their max-min share (counting what it asks) start before it.
- **seats**: with every seat taken, after `seat_patience_steps`, the tenant furthest
  over its share of the seats gives one to a tenant within its own.
- **the step**: the step's prompt tokens are one share for all tenants together
  (StepShare), water-filled by weight.
- **the policy's own preemption** (`Policy.preempts_for`: vtc-preempt's counter gap,
  priority's importance) is asked about the victim these rules would take.

The policy only states its order and weights (`victim_key`, `weight_of`) and whether
it shares by weight at all (`shares_by_weight`: the VTC family; `fcfs` and `priority`
keep what they hold until it finishes, as vLLM does). The scheduler applies every
answer: it is the only one that changes `running` (core/scheduler.py).

Why this does not thrash: memory and seats move only from a tenant over its share to
one within its own, so the one that gave cannot take them straight back (the one that
took is not over); a tenant that gave memory steps aside for the rest of the step.
Where nothing is contended (one tenant, or everyone within their share) no rule acts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tokenfair.core.kv_cache import KVCacheManager, PrefixHit
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.batch_share import seat_share_victim
from tokenfair.core.policies.memory_share import (
    MemoryAsk,
    holding_victim_key,
    memory_share_victim,
    over_memory_share,
)
from tokenfair.core.policies.view import RequestView
from tokenfair.core.request import Request
from tokenfair.core.scheduler_config import SchedulerConfig
from tokenfair.core.step_share import StepShare


def holding_key(policy: Policy, request: RequestView, holdings: Mapping[str, int]) -> tuple:
    """The memory victim's order knowing what each tenant holds, largest first: the
    tenant holding the most per unit of weight, then the policy's own order (a policy
    that does not share by weight: its own order alone). Drivers that keep their own
    running list (the vLLM plugin) sort it by this."""
    if not policy.shares_by_weight:
        return policy.victim_key(request)
    return (holding_victim_key(request, holdings, policy.weight_of), *policy.victim_key(request))


def gives_way(policy: Policy, ask: MemoryAsk) -> bool:
    """Asked of a head short of memory (`ask.waiting` empty): whether it lets the next
    tenant's request try; of a request behind such heads: whether it waits too (its
    tenant would be over its max-min share counting what they ask). Never, for a policy
    that does not share by weight: a head that does not fit stops admission."""
    return policy.shares_by_weight and over_memory_share(ask, policy.weight_of)


def memory_giver(policy: Policy, ask: MemoryAsk) -> RequestView | None:
    """The running request whose memory goes to the head short of it (the newest of the
    tenant furthest over its entitlement, while the head's stays within its own), or
    None; always None for a policy that does not share by weight."""
    if not (policy.shares_by_weight and ask.running):
        return None
    return memory_share_victim(ask, policy.weight_of)


@dataclass(frozen=True, slots=True)
class Room:
    """What a blocked head gets: a running request to push out for it (`victim`), and
    whether that request gives its memory (its tenant then steps aside for the step)."""

    victim: RequestView
    gives_memory: bool


class Contention:
    def __init__(self, config: SchedulerConfig, policy: Policy, kv: KVCacheManager) -> None:
        self.config = config
        self.policy = policy
        self.kv = kv
        self.step = StepShare.for_config(config, policy)  # None: steps not shared
        # Memory is shared at admission only under optimistic admission (reserve
        # admission never runs short) and by a policy that shares by weight.
        self.shares_memory = config.share_memory and config.admission == "optimistic"
        self._step = 0
        # Blocked requests: id -> the first and the last step each waited.
        self._waits: dict[str, tuple[int, int]] = {}
        # Heads that stepped aside for memory in this step: tenant -> blocks asked.
        self._aside_for_memory: dict[str, int] = {}

    def next_step(self, running: Sequence[Request]) -> None:
        self._step += 1
        self._aside_for_memory.clear()
        if self.step is not None:
            self.step.begin(running)

    # --- running short of memory ---
    def shortage_victim(self, running: Sequence[Request]) -> RequestView:
        """Who is pushed out when the running requests' next tokens do not fit."""
        policy = self.policy
        if self.config.share_memory and policy.shares_by_weight:
            held = self.kv.holdings()
            return max(running, key=lambda request: holding_key(policy, request, held))
        return max(running, key=policy.victim_key)

    # --- a head that cannot start ---
    def next_candidate(self, aside: set[str]) -> tuple[RequestView | None, bool]:
        """The next request to try, and whether it is the head of the queue: the head,
        unless its tenant stepped aside; then the first waiting request (in the
        policy's order) of another tenant."""
        head = self.policy.peek()
        if head is None or head.client not in aside:
            return head, True
        for waiting in self.policy.waiting_heads():  # a tenant's first request speaks for it
            if waiting.client not in aside:
                return waiting, False
        return None, False

    def make_room(
        self, head: Request, hit: PrefixHit, settled: Sequence[Request], num_running: int
    ) -> Room | None:
        """A running request (among `settled`: not admitted in this step) to push out so
        that `head`, which has no seat or no memory, can start; or None."""
        if not settled:
            return None
        config, policy = self.config, self.policy
        short_of_memory = num_running < config.max_num_seqs
        weighted = policy.shares_by_weight
        # The policy's own preemption, asked about the victim the rules would take.
        if short_of_memory and self.shares_memory and weighted:
            candidate = memory_giver(policy, self._ask(head, hit, settled))
        else:
            candidate = max(settled, key=policy.victim_key)
        if candidate is not None and policy.preempts_for(head, candidate):
            return Room(candidate, gives_memory=short_of_memory and self.shares_memory)
        if not weighted:
            return None
        waited = self._waited(head)
        if not short_of_memory:
            if config.share_seats and waited >= config.seat_patience_steps:
                seat = seat_share_victim(head, settled, policy.weight_of)
                return None if seat is None else Room(seat, gives_memory=False)
            return None
        if self.shares_memory and waited >= config.memory_patience_steps:
            # The memory share's victim, found above for the policy's own question.
            return None if candidate is None else Room(candidate, gives_memory=True)
        return None

    def steps_aside(self, head: Request, hit: PrefixHit, running: Sequence[Request]) -> bool:
        """Whether `head`, short of memory with nobody pushed out for it, lets the next
        tenant's request try: always, when the policy shares by weight (the tenants it
        lets pass are checked by `may_pass`); else it stops admission, as VTC's rule
        and vLLM's do."""
        if not (self.shares_memory and self.policy.shares_by_weight):
            return False
        ask = self._ask(head, hit, running)
        self._aside_for_memory[head.client] = ask.need_blocks
        return True

    def may_pass(
        self,
        candidate: Request,
        hit: PrefixHit | None,
        running: Sequence[Request],
        aside: set[str],
    ) -> bool:
        """Whether `candidate`, behind heads of the queue that stepped aside, may start
        before them: always when they stepped aside for the step's share only (memory
        is not short); else only if its tenant stays within its max-min share of the
        pool counting what those heads ask (it then takes no memory they are owed).
        When not, its tenant joins `aside`. With `hit` None it is judged asking
        nothing: a tenant over its share then is over with any request (a tenant's
        share never grows with what it asks), so the scheduler asks so before it looks
        the candidate's prefix up."""
        if not self._aside_for_memory:
            return True
        if gives_way(self.policy, self._ask(candidate, hit, running, waiting=True)):
            aside.add(candidate.client)
            return False
        return True

    def _ask(
        self,
        head: Request,
        hit: PrefixHit | None,
        running: Sequence[Request],
        waiting: bool = False,
    ) -> MemoryAsk:
        """A head short of memory: the blocks its whole prompt adds to what its tenant
        holds (cached blocks its tenant's requests hold already count once; none with
        `hit` None), and what every tenant holds; `waiting`: and what the heads that
        stepped aside ask."""
        kv = self.kv
        if hit is None:
            need = 0
        else:
            need = kv.blocks_for(head.num_tokens) - len(hit.blocks) + hit.idle_blocks
        aside = self._aside_for_memory if waiting else {}
        return MemoryAsk(head, need, running, kv.holdings(), kv.num_blocks, kv.block_size, aside)

    def _waited(self, head: Request) -> int:
        """Steps `head` has waited blocked without a break (0 in the first)."""
        step, waits = self._step, self._waits
        first, last = waits.get(head.request_id, (step, step))
        if last < step - 1:
            first = step  # a new wait
        waits[head.request_id] = (first, step)
        if len(waits) > 256:  # forget the waits that ended
            self._waits = {key: w for key, w in waits.items() if w[1] >= step - 1}
        return step - first
