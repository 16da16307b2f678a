"""One step's prompt tokens shared among tenants, inside vLLM's loop.

The core's rule (core/step_share.py, `StepShare`): while more than one tenant has work,
the step's prompt chunks take at most `limit` tokens together, water-filled by weight
among the tenants in prefill or waiting; a request starting now whose whole prompt fits
runs at once, and the step's other prompt chunks are then cut to an eighth of the limit
together (`newcomer_chunk`). vLLM fills a step's token budget first with the running
requests, in `running`'s order, then with waiting ones, with no notion of tenants.

The plugin decides before vLLM's pass, with the core's `StepShare` itself:

- each running request in prefill gets its chunk for the step, in `running`'s order
  (the order vLLM schedules them in), from its tenant's part of the limit; a request
  whose tenant had its part runs no prompt in this step (vLLM skips it and goes on);
- when the request vLLM will try first among the waiting ones would start with its
  whole prompt within the limit, the running prompt chunks are cut to an eighth of the
  limit together, before vLLM runs them (vLLM schedules the running requests before
  it admits anyone: the cut cannot wait for the admission, as the core's does);
- a waiting request's chunk is asked of the same `StepShare` as vLLM reaches it, and
  the waiting requests of a tenant that had its part go after the others' for the step.

vLLM asks the scheduler for each request's chunk at one place, after its own caps
(the token budget, `long_prefill_token_threshold`, the encoder budget):
`Scheduler._reserve_prefill_lookahead`, which the plugin overrides (scheduler.py) to
return `chunk` of this plan. A running request given 0 tokens is skipped for the step
as vLLM skips one without work; a waiting one given 0 is left for a later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from tokenfair.core.policies.base import Policy
from tokenfair.core.request import Request as CoreRequest
from tokenfair.core.step_share import StepShare, newcomer_chunk


@dataclass(slots=True)
class Prefill:
    """What the step share reads of a running request (core/step_share.py `_part`)."""

    request_id: str
    client: str
    input_tokens: int
    num_output_tokens: int
    num_computed_tokens: int

    @property
    def left(self) -> int:
        """The tokens it has to compute before its next one is sampled, plus one."""
        return self.input_tokens + self.num_output_tokens - self.num_computed_tokens


class StepPlan:
    """The step's prompt chunks by request, planned before vLLM's pass (`plan`) and
    read as vLLM reaches each request (`chunk`)."""

    def __init__(self, limit: int, policy: Policy) -> None:
        self.limit = limit
        self._share = StepShare(limit, policy)
        self._caps: dict[str, int] = {}  # running request id -> its prompt tokens
        self._cut = 0  # a newcomer starts: the other chunks' cap (0: none)
        self.active = False  # more than one tenant has work in this step

    def plan(
        self,
        running: Sequence[Prefill],
        waiting: Sequence[Prefill],
        newcomer: Prefill | None,
    ) -> frozenset[str]:
        """Plan the running requests' chunks. `waiting`: the first waiting request of
        each tenant; `newcomer`: the one vLLM will try first, when it can start (a seat
        and the memory for its prompt; None: nobody waiting starts in this step, and the
        running prefills take the whole share). Returns the tenants whose waiting requests go
        after the others' for the step: they had their part of it, and their first
        request would not start whole."""
        share = self._share
        # The core's StepShare reads these attributes of its running requests only.
        share.begin(cast(Sequence[CoreRequest], running))
        self._caps.clear()
        self._cut = 0
        tenants = {request.client for request in running}
        tenants.update(request.client for request in waiting)
        self.active = len(tenants) > 1
        if not self.active:
            return frozenset()  # a tenant alone takes the whole budget
        prefilling = [request for request in running if request.left > 1]
        for request in prefilling:
            tokens = share.allow(request.client, request.left)
            share.count(request.client, tokens)
            self._caps[request.request_id] = tokens
        if newcomer is not None and 1 < newcomer.left <= self.limit and prefilling:
            self._cut = max(1, newcomer_chunk(self.limit) // len(prefilling))
            for request_id, tokens in self._caps.items():
                self._caps[request_id] = min(tokens, self._cut)
        elif newcomer is None:
            self._top_up(prefilling)
        return frozenset(
            request.client
            for request in waiting
            if request.left > self.limit and share.allow(request.client, request.left) == 0
        )

    def _top_up(self, prefilling: Sequence[Prefill]) -> None:
        """Nobody waiting can start in this step: the share the waiting tenants asked
        for goes to the running prefills, in `running`'s order (as the core's
        `StepShare.top_up`), so a step carries a whole share while a tenant is in
        prefill."""
        left = self.limit - sum(self._caps.values())
        for request in prefilling:
            if left <= 0:
                return
            tokens = self._caps[request.request_id]
            extra = min(request.left - tokens, left)
            if extra > 0:
                self._caps[request.request_id] = tokens + extra
                self._share.count(request.client, extra)
                left -= extra

    def chunk(self, request_id: str, tenant: str | None, tokens: int, left: int) -> int:
        """The prompt tokens vLLM may run for the request in this step, of the `tokens`
        it would; `left`: what it has left to compute. `tenant`: a waiting request's
        (None: a running one)."""
        if not self.active or tokens <= 1 or left <= 1:
            return tokens  # a decode, or a tenant alone
        if tenant is None:
            return min(tokens, self._caps.get(request_id, tokens))
        share = self._share
        allowed = share.allow(tenant, tokens, starts=tokens == left)
        starts = allowed == tokens == left and tokens <= self.limit
        if not starts and self._cut:
            allowed = min(allowed, self._cut)
        share.count(tenant, allowed)
        return allowed
