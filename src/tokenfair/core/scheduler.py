"""The scheduler: each step, who runs, how many tokens, in which KV blocks.

One step, top to bottom:
  1. aborted requests are already gone: `abort` frees their blocks at once;
  2. make room for the running requests' next tokens, preempting victims the policy
     picks (recompute or swap) when the pool is short: only the request that was short
     is retried, a victim already planned leaves the plan and gives its tokens back
     (as vLLM v1 does); bring swapped requests back when there is room;
  3. admit waiting requests in policy order under max_num_seqs, the token budget and
     memory: the first that does not fit stops admission, unless a seat or memory goes
     to it or it lets the tenants within their share pass (contention.py decides who
     gives up what to whom; the scheduler applies it and is the only one to change
     `running`);
  4. charge the policy: prompts at admission, output tokens as they are generated
     (`update`).

Admission modes: `reserve` admits a request only if the pool can hold every running
request and it at their peak, each growing to prompt + max_tokens, and so never runs
out mid-generation (the paper's system; like its router, it counts that shorter
requests finish and free their blocks before longer ones peak). Blocks are still
taken as tokens arrive. `optimistic` admits whatever the next step needs and preempts
on shortage (vLLM's behaviour).

The `paper` preset reproduces the S-LoRA/LightLLM router that produced the paper's
numbers: admission only when nothing runs or every `admission_interval_steps` decode
steps (retried at every step after a failed attempt), admitted prompts prefilled in a
step of their own, a cap on new prompt tokens per admission, the first output token
(made by the prefill) left uncharged, and that router's exact peak-memory check: a
running request peaks at prompt + max_tokens - 1 (its last token is never written to
the cache), the peak must stay strictly below the pool, and every distinct client in
the batch holds `adapter_tokens_per_client` tokens of the pool for its LoRA adapter.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from tokenfair.core.batch import ExecutorOutput, ScheduledRequest, SchedulerOutput
from tokenfair.core.contention import Contention
from tokenfair.core.kv_cache import KVCacheManager, PrefixHit
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.starts import Starts
from tokenfair.core.policies.view import RequestView
from tokenfair.core.prefix_cache import PrefixCacheView
from tokenfair.core.request import FinishReason, Request, RequestStatus
from tokenfair.core.reserve import reserve_peak_fits
from tokenfair.core.scheduler_config import PAPER_ADAPTER_TOKENS, ConfigError, SchedulerConfig

__all__ = ["PAPER_ADAPTER_TOKENS", "ConfigError", "Scheduler", "SchedulerConfig"]


class Scheduler:
    def __init__(self, config: SchedulerConfig, policy: Policy):
        self.config = config
        self.policy = policy
        self.kv = KVCacheManager(
            config.num_blocks,
            config.block_size,
            config.num_swap_blocks,
            config.enable_prefix_caching,
        )
        # A view: the policy may look and hint, never take or free a block.
        policy.attach_prefix_cache(PrefixCacheView(self.kv))
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.running: list[Request] = []  # admission order
        self.swapped: deque[Request] = deque()  # swap-out order
        # Swap-out copies from force_preempt, delivered with the next step, by request.
        self._pending_swap_out: dict[str, list[tuple[int, int]]] = {}
        self._steps_since_admission = 0
        # Who gives up what to whom: seats, memory and the step's tokens.
        self.contention = Contention(config, policy, self.kv)
        self._step_share = self.contention.step  # None: steps not shared
        self._starts = Starts(policy)  # tells the policy each start, numbered
        # Tenants whose head stepped aside in the last admission (memory or step share).
        self.stepped_aside: frozenset[str] = frozenset()
        self.num_preemptions = 0  # all causes
        # The pool could not hold the running requests' next tokens (a sizing problem)...
        self.num_memory_preemptions = 0
        self.memory_preemptions_by_client: dict[str, int] = {}
        # ...versus the policy's own choice, to admit a waiting request (vtc-preempt,
        # priority); the rest were forced by an operator.
        self.num_policy_preemptions = 0
        self.num_swaps = 0
        self.preemptions_by_client: dict[str, int] = {}

    # --- arrivals and cancellation ---
    def add_request(self, request: Request, now: float) -> bool:
        """Queue a new request; False (and the request finished as REJECTED) if refused."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not self._can_ever_fit(request) or not self.policy.accept(request, now):
            self._finish(request, FinishReason.REJECTED, now)
            return False
        request.status = RequestStatus.WAITING
        request.first_token_free = not self.config.charge_first_token
        self.requests[request.request_id] = request
        self.policy.add(request, now)
        return True

    def _can_ever_fit(self, request: Request) -> bool:
        # Also in optimistic mode: a request that outgrows the whole pool would preempt
        # itself forever (vLLM rejects it against max_model_len likewise). In reserve
        # mode it must pass the peak check alone (adapter share and margin included).
        if self.config.admission == "reserve":
            return reserve_peak_fits([request], self.kv, self.config)
        return self.kv.blocks_for(request.max_total_tokens) <= self.kv.num_blocks

    def abort(self, request_id: str, now: float, reason: FinishReason = FinishReason.ABORT) -> bool:
        """End a request wherever it is; its slot and blocks are free before the next step."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        status = request.status
        if status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self.policy.remove(request)
            self.kv.free(request)
        elif status is RequestStatus.RUNNING:
            self.running.remove(request)
            self.kv.free(request)
        elif status is RequestStatus.SWAPPED:
            self.swapped.remove(request)
            self.kv.free_swap(request)
            # Copies queued by force_preempt would write into swap blocks now free.
            self._pending_swap_out.pop(request_id, None)
        self._finish(request, reason, now)
        if request.ever_admitted:
            # After _finish, so the policy sees the finish reason (length predictors
            # learn from stops); a preempted request may hold a predicted charge too.
            self.policy.on_finish(request)
        return True

    def _finish(self, request: Request, reason: FinishReason, now: float) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_s = now
        self.requests.pop(request.request_id, None)

    # --- queries ---
    @property
    def num_waiting(self) -> int:
        return len(self.policy)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def own(self, request: RequestView) -> Request:
        """The scheduler's request behind what the policy handed back (a policy sees and
        returns requests only as `RequestView`s)."""
        return self.requests[request.request_id]

    # --- one step ---
    def schedule(self, now: float) -> SchedulerOutput:
        self.contention.next_step(self.running)
        out = SchedulerOutput(block_size=self.config.block_size)
        if self._pending_swap_out:  # from force_preempt between steps
            out.swap_out = [copy for copies in self._pending_swap_out.values() for copy in copies]
            self._pending_swap_out = {}
        budget = self.config.max_batched_tokens
        if self.config.separate_prefill:
            self._schedule_separate_prefill(out, now)
        else:
            budget = self._schedule_running(out, budget)
            budget = self._schedule_swapped_in(out, budget)
            self._admit(out, budget, now)
        return out

    def plan_chunk(self, remaining: int, budget: int) -> int:
        """Tokens to run of a request with `remaining` tokens left to compute."""
        if remaining <= budget:
            return remaining
        return budget if self.config.enable_chunked_prefill else 0

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Schedule every running request's next tokens, preempting while memory is short.

        A request whose next tokens the pool cannot hold preempts the policy's victim
        and is retried alone, with the budget it has then; a victim already in this
        step's plan leaves it and gives its tokens back; when the victim is the short
        request itself, planning moves on to the next one. The plan is never rebuilt.
        """
        kv = self.kv
        table_of, allocate, block_size = kv.block_table, kv.allocate, kv.block_size
        chunked = self.config.enable_chunked_prefill
        share = self._step_share
        plan: list[ScheduledRequest] = []
        left = budget
        todo = self.running
        # This loop runs for every running request on every step: keep it plain.
        while True:
            for request in todo:
                start = request.num_computed_tokens
                n = request.input_tokens + request.num_output_tokens - start
                if n > left:
                    n = left if chunked else 0
                if n > 1 and share is not None:
                    n = share.allow(request.client, n)  # a prompt chunk: the step is shared
                if n:
                    table = table_of(request.request_id)
                    if start + n > len(table) * block_size and allocate(request, start + n) is None:
                        break  # short of blocks: preempt below, then retry this request
                    left -= n
                    plan.append(ScheduledRequest(request, n, start, table))
                    if n > 1 and share is not None:
                        share.count(request.client, n)
            else:
                break
            left, todo = self._preempt_for_memory(request, plan, left, out)
        out.scheduled.extend(plan)
        return left

    def _preempt_for_memory(
        self, short: Request, plan: list[ScheduledRequest], left: int, out: SchedulerOutput
    ) -> tuple[int, list[Request]]:
        """Preempt the policy's victim because `short` found the pool short; return the
        budget left and the running requests still to plan, `short` first if it stays."""
        running = self.running
        victim = self.own(self.contention.shortage_victim(running))
        at = running.index(short)
        self.preempt(victim, out, cause="memory")
        if victim is short:
            return left, running[at:]  # the request after it now sits at `at`
        for index, scheduled in enumerate(plan):
            if scheduled.request is victim:
                del plan[index]
                left += scheduled.num_new_tokens
                if self._step_share is not None:
                    self._step_share.give_back(victim.client, scheduled.num_new_tokens)
                break
        return left, running[running.index(short) :]

    def _schedule_swapped_in(self, out: SchedulerOutput, budget: int) -> int:
        """Bring swapped requests back, oldest first, while seats, budget and blocks allow."""
        kv = self.kv
        while self.swapped and len(self.running) < self.config.max_num_seqs:
            request = self.swapped[0]
            start = request.num_computed_tokens
            n = self.plan_chunk(request.num_tokens - start, budget)
            copies = kv.swap_in(request, start + n) if n else None
            if copies is None:
                break
            self.swapped.popleft()
            out.swap_in.extend(copies)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.scheduled.append(
                ScheduledRequest(request, n, start, kv.block_table(request.request_id))
            )
            budget -= n
        return budget

    def _schedule_separate_prefill(self, out: SchedulerOutput, now: float) -> None:
        """The paper's router: a step is either new prompts only, or decode for all."""
        config = self.config
        if len(self.policy) and (
            not self.running or self._steps_since_admission >= config.admission_interval_steps
        ):
            if not config.retry_admission_every_step:
                self._steps_since_admission = 0  # a failed attempt waits a full interval
            budget = config.max_prefill_tokens or config.max_batched_tokens
            if self._admit(out, budget, now):
                self._steps_since_admission = 0
                return
        self._steps_since_admission += 1
        budget = self._schedule_running(out, config.max_batched_tokens)
        self._schedule_swapped_in(out, budget)

    # --- admission ---
    def _admit(self, out: SchedulerOutput, budget: int, now: float) -> int:
        """Admit waiting requests in policy order; return how many were admitted.

        The head's cached prefix is looked up first and taken only with its admission.
        The first request that does not fit stops admission (no skipping ahead), unless
        someone's seat or memory goes to it, or it lets the tenants within their share
        pass (its tenant joins `aside` and the next tenant's request is tried).
        """
        if self.swapped:
            return 0  # swapped requests come back before anyone new is let in
        contention, step_share = self.contention, self._step_share
        admitted = 0
        aside: set[str] = set()  # tenants whose head stepped aside (memory or step share)
        while budget > 0:
            waiting, first_in_line = contention.next_candidate(aside)
            if waiting is None:
                break
            head = self.own(waiting)
            # Behind heads that stepped aside, a tenant over its share with nothing asked
            # waits without its prefix being looked up.
            if not (first_in_line or contention.may_pass(head, None, self.running, aside)):
                continue
            # Its cached prefix, looked up (nothing taken): plan as if it were computed.
            hit = self.kv.lookup_prefix(head)
            if not (first_in_line or contention.may_pass(head, hit, self.running, aside)):
                continue
            planned = self._plan_start(head, hit, budget, out)
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
        if step_share is not None:
            if admitted:
                step_share.cut_for_newcomers(out.scheduled)
            step_share.top_up(out.scheduled, budget, self.kv.allocate)
        self.stepped_aside = frozenset(aside) if aside else frozenset()  # (a singleton)
        return admitted

    def _plan_start(
        self, head: Request, hit: PrefixHit, budget: int, out: SchedulerOutput
    ) -> tuple[int, int] | None:
        """The tokens `head` would run in this step, and those its blocks must hold (a
        shared prompt must not run short halfway); None when its tenant had its share
        of the step."""
        remaining = head.num_tokens - hit.num_tokens
        n = self.plan_chunk(remaining, budget)
        if n == 0 and not out.scheduled:
            n = remaining  # too big for the budget and chunking is off: alone, not never
        unshared = n
        if n > 1 and self._step_share is not None:
            n = self._step_share.allow(head.client, n, starts=n == remaining)
            if n == 0:
                return None
        return n, unshared

    def _allocate(self, head: Request, hit: PrefixHit, n: int, unshared: int) -> list[int] | None:
        """Its block table when it fits (a seat, the reserve check, the blocks); None."""
        config = self.config
        if n <= 0 or len(self.running) >= config.max_num_seqs:
            return None
        if config.admission == "reserve" and not reserve_peak_fits(
            [*self.running, head], self.kv, config
        ):
            return None
        # Last: takes the prefix and the new blocks if they all fit, else nothing.
        return self.kv.allocate(head, hit.num_tokens + unshared, hit)

    def _make_room(
        self,
        head: Request,
        hit: PrefixHit,
        n: int,
        admitted: int,
        out: SchedulerOutput,
        aside: set[str],
    ) -> int | None:
        """`head` does not fit: push out the request the contention rules take for it
        (return the tokens it gives back to the budget), or let the tenants within their
        share pass it (0); None: admission stops here."""
        # It is next in line: its idle cached blocks become the most recently used, so
        # evicted last (docs/experiments.md's locality numbers have it).
        self.kv.touch_prefix(hit)
        # Never push out a request admitted in this step (the tail of `running`).
        settled = self.running[:-admitted] if admitted else self.running
        room = self.contention.make_room(head, hit, settled, len(self.running)) if n else None
        if room is not None:
            victim = self.own(room.victim)
            returned = self.unschedule(victim, out)  # its tokens in this step
            self.preempt(victim, out, mode="recompute", cause="policy")
            if room.gives_memory:
                aside.add(victim.client)  # it gave way: it does not take it back now
            return returned
        if (
            n
            and len(self.running) < self.config.max_num_seqs
            and self.contention.steps_aside(head, hit, self.running)
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
        computed = hit.num_tokens
        head.num_computed_tokens = computed
        if first_in_line:
            self.policy.pop()
        else:
            self.policy.remove(head)  # a request behind the head of the queue
        self.kv.count_prefix_query(computed, head.num_tokens)
        head.status = RequestStatus.RUNNING
        if head.scheduled_s is None:
            head.scheduled_s = now
        self.running.append(head)
        self._starts.start(head, computed, now)
        out.scheduled.append(ScheduledRequest(head, n, computed, table))
        if self._step_share is not None:
            self._step_share.admitted(head, n, computed + n == head.num_tokens)

    # --- preemption ---
    def unschedule(self, request: Request, out: SchedulerOutput) -> int:
        """Drop `request` from this step's batch; return the tokens it had there."""
        returned = sum(s.num_new_tokens for s in out.scheduled if s.request is request)
        if returned:
            out.scheduled = [s for s in out.scheduled if s.request is not request]
            if self._step_share is not None:
                self._step_share.give_back(request.client, returned)
        return returned

    def preempt(
        self,
        victim: Request,
        out: SchedulerOutput,
        mode: str | None = None,
        cause: Literal["memory", "policy", "operator"] = "memory",
    ) -> None:
        """Push `victim` out (its swap-out copies go to `out`). It must not be in
        `out.scheduled`: a caller that scheduled it drops it first (`unschedule`)."""
        mode = mode or self.config.preemption
        self.running.remove(victim)
        self.num_preemptions += 1
        victim.preemptions += 1
        client = victim.client
        self.preemptions_by_client[client] = self.preemptions_by_client.get(client, 0) + 1
        if cause == "memory":
            self.num_memory_preemptions += 1
            by_client = self.memory_preemptions_by_client
            by_client[client] = by_client.get(client, 0) + 1
        elif cause == "policy":
            self.num_policy_preemptions += 1
        if (
            mode == "swap"
            and victim.num_computed_tokens
            and (mapping := self.kv.swap_out(victim)) is not None
        ):
            out.swap_out.extend(mapping)
            victim.status = RequestStatus.SWAPPED
            self.swapped.append(victim)
            self.num_swaps += 1
            return
        self.kv.free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        self.policy.requeue(victim)

    def force_preempt(self, request_id: str, mode: Literal["recompute", "swap"]) -> None:
        """Preempt a running request now (tests and operators); effective next step."""
        request = self.requests[request_id]
        if request.status is not RequestStatus.RUNNING:
            raise ValueError(f"request {request_id!r} is not running")
        out = SchedulerOutput(block_size=self.config.block_size)
        self.preempt(request, out, mode, cause="operator")
        if out.swap_out:
            self._pending_swap_out[request_id] = out.swap_out

    # --- after the step ---
    def update(self, out: SchedulerOutput, result: ExecutorOutput, now: float) -> list[Request]:
        """Apply the step's results; return the requests that produced a token."""
        kv, policy = self.kv, self.policy
        charges = policy.charges_output
        on_output = policy.on_output
        caching = kv.enable_prefix_caching
        sampled = result.sampled
        produced: list[Request] = []
        ended: list[Request] = []  # finished in this step
        for s in out.scheduled:
            request = s.request
            if request.status is not RequestStatus.RUNNING:
                continue  # aborted or preempted while the step ran
            request.num_computed_tokens = s.start + s.num_new_tokens
            if caching:
                kv.cache_full_blocks(request)
            if not s.samples:
                continue
            token = sampled[request.request_id]
            # Request.append_output inline: this runs once per generated token, and the
            # count must be current before on_output charges from it.
            request.output_token_ids.append(token)
            generated = request.num_output_tokens + 1
            request.num_output_tokens = generated
            if request.first_token_s is None:
                request.first_token_s = now
            if charges:
                on_output(request, 1)
            produced.append(request)
            reason = None
            if token in request.eos_token_ids and not request.sampling.ignore_eos:
                reason = FinishReason.STOP
            elif (target := request.target_output_tokens) is not None and generated >= target:
                reason = FinishReason.STOP  # a replay's stand-in for the model's own stop
            elif generated >= request.sampling.max_tokens:
                reason = FinishReason.LENGTH
            if reason is not None:
                self._finish_running(request, reason, now)
                ended.append(request)
        if ended:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
            if policy.charges_batch_on_finish:
                stepped = [
                    s.request for s in out.scheduled if s.request.status is RequestStatus.RUNNING
                ]
                policy.on_batch_finish(stepped + ended)
        return produced

    def _finish_running(self, request: Request, reason: FinishReason, now: float) -> None:
        self.kv.free(request)
        self._finish(request, reason, now)
        self.policy.on_finish(request)

    def finish(self, request_id: str, reason: FinishReason, now: float) -> None:
        """End a request for a reason found outside the scheduler (a stop string)."""
        self.abort(request_id, now, reason)
