"""What a blocked head of the queue may do about what other tenants hold.

VTC picks the head of the queue; when the head cannot start (every seat taken, or the
KV pool short), the scheduler asks `HoldingShare.victim` whether someone's running
request should give its seat or its memory to it, in this order:
  1. the policy's own preemption (`preempt_for`: vtc-preempt's counter gap; short of
     memory with `share_memory`, `preempt_for_holdings`, whose victim is the memory
     share's);
  2. seats (`share_seats`): with every seat taken, after the head has waited
     `seat_patience_steps` steps first in line, a seat from the tenant furthest over
     its weighted share of the seats (policies/batch_share.py);
  3. memory (`share_memory`): with a seat free but the pool short, after the head has
     waited `memory_patience_steps` steps, the memory of the tenant furthest over its
     weighted share of the pool, if the head's tenant stays within its own
     (policies/memory_share.py).
And when nobody is pushed out, a head short of memory steps aside (`steps_aside`),
whatever its tenant holds: it does not stop the admission of tenants within their
max-min share of the pool counting what it asks, and only theirs (`may_pass`), so a
large request is never passed over by small ones of tenants over their share. A
tenant that gave memory to another (`took_memory`) steps aside for the rest of the
step too, so that it does not take the memory straight back.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenfair.core.kv_cache import KVCacheManager, PrefixHit
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.memory_share import MemoryAsk
from tokenfair.core.policies.view import RequestView
from tokenfair.core.request import Request
from tokenfair.core.scheduler_config import SchedulerConfig


class HoldingShare:
    def __init__(self, config: SchedulerConfig, policy: Policy, kv: KVCacheManager) -> None:
        self.config = config
        self.policy = policy
        self.kv = kv
        self._step = 0
        # Whether the last victim gives its memory (its tenant then steps aside).
        self.took_memory = False
        # Blocked requests: id -> the first and the last step each waited.
        self._waits: dict[str, tuple[int, int]] = {}
        # Heads that stepped aside for memory in this step: tenant -> blocks asked.
        self._aside_for_memory: dict[str, int] = {}

    def next_step(self) -> None:
        self._step += 1
        self._aside_for_memory.clear()

    def memory_shortage_victim(self, running: Sequence[Request]) -> RequestView:
        """Who is pushed out when the running requests' next tokens do not fit."""
        if self.config.share_memory:
            return self.policy.holding_victim(running, self.kv.holdings())
        return self.policy.victim(running)

    def next_candidate(self, aside: set[str]) -> tuple[RequestView | None, bool]:
        """The next request to try, and whether it is the head of the queue: the head,
        unless its tenant stepped aside; then the first waiting request (in the
        policy's order) of another tenant."""
        head = self.policy.peek()
        if head is None or head.client not in aside:
            return head, True
        for waiting in self.policy.waiting_requests():
            if waiting.client not in aside:
                return waiting, False
        return None, False

    def _ask(
        self, head: Request, hit: PrefixHit, running: Sequence[Request], waiting: bool = False
    ) -> MemoryAsk:
        """What the policy is asked about a head short of memory: the blocks its whole
        prompt adds to what its tenant holds (cached blocks its tenant's requests hold
        already count once), and what every tenant holds; `waiting`: and what the heads
        that stepped aside in this step ask."""
        kv = self.kv
        need = kv.blocks_for(head.num_tokens) - len(hit.blocks) + hit.idle_blocks
        aside = self._aside_for_memory if waiting else {}
        return MemoryAsk(head, need, running, kv.holdings(), kv.num_blocks, kv.block_size, aside)

    def victim(
        self, head: Request, hit: PrefixHit, settled: Sequence[Request], num_running: int
    ) -> RequestView | None:
        """A running request (among `settled`: not admitted in this step) to push out
        so that `head` can start, or None."""
        self.took_memory = False
        if not settled:
            return None
        config, policy = self.config, self.policy
        shares_memory = config.share_memory and config.admission == "optimistic"
        if shares_memory and num_running < config.max_num_seqs:  # short of memory
            chosen = policy.preempt_for_holdings(self._ask(head, hit, settled))
            self.took_memory = chosen is not None
        else:
            chosen = policy.preempt_for(head, settled)
        if chosen is not None:
            return chosen
        waited = self._waited(head)
        if num_running >= config.max_num_seqs:
            if config.share_seats and waited >= config.seat_patience_steps:
                return policy.seat_victim(head, settled)
            return None
        if shares_memory and waited >= config.memory_patience_steps:
            chosen = policy.memory_victim(self._ask(head, hit, settled))
            self.took_memory = chosen is not None
            return chosen
        return None

    def steps_aside(self, head: Request, hit: PrefixHit, running: Sequence[Request]) -> bool:
        """Whether `head`, short of memory, lets the next tenant's request try instead
        (the VTC family: always; the tenants it lets pass are checked by `may_pass`)."""
        config = self.config
        if not (config.share_memory and config.admission == "optimistic"):
            return False
        ask = self._ask(head, hit, running)
        if not self.policy.over_memory_share(ask):
            return False
        self._aside_for_memory[head.client] = ask.need_blocks
        return True

    def may_pass(
        self, candidate: Request, hit: PrefixHit, running: Sequence[Request], aside: set[str]
    ) -> bool:
        """Whether `candidate`, behind heads of the queue that stepped aside, may start
        before them: always when they stepped aside for the step's share only (memory
        is not short); else only if the policy finds its tenant within its share of
        the pool, counting what those heads ask. A tenant over its share taking the
        memory they wait for would keep them waiting, and overcommit the pool. When
        not, its tenant joins `aside`."""
        if not self._aside_for_memory:
            return True
        if self.policy.over_memory_share(self._ask(candidate, hit, running, True)):
            aside.add(candidate.client)
            return False
        return True

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
