"""One step's prompt tokens, shared among tenants while more than one has work.

A step lasts about as long as the tokens it carries: on the A10G profile a
3,500-token prefill chunk makes a step of 0.8 s instead of 0.04 s. Every running
request of every tenant advances one token per step, and a request that arrives waits
for the step under way to end, so a tenant whose long prompts fill the steps sets the
other tenants' time per output token and adds to their time to first token, whatever
their counters say (docs/fairness.md, "What a tenant holds").

While more than one tenant has requests running or waiting, the prompt chunks of a
step take at most `limit` tokens *together*, shared among the tenants whose running
requests are still in prefill by weight, max-min (water-filling): a tenant asking less
than its part keeps what it asks, the rest is split among the others. However many
tenants flood long prompts, a step stays as short as one tenant's share made it, so a
light tenant's decode pace and the wait of its new request for the step under way do
not grow with their number. The rest of a prompt goes in the next steps, and a waiting
request of a tenant that had its share of the step lets the next tenant's start.

Requests starting now whose whole prompts fit the limit together run them at once
(their first tokens come out of this step), and the step's other prompt chunks are
then cut to an eighth of the limit together (`newcomer_chunk`), so that the newcomer's first step is
short too. A tenant alone takes the whole token budget. The limit is the trade between
the long prompts' prefill rate and the other tenants' decode pace, which on these
step-time models is about one for one (`SchedulerConfig.step_share_tokens`; the figure
in docs/fairness.md, "What a tenant holds").

One `StepShare` serves a scheduler for its whole life: `begin` clears it at each step
(the step runs thousands of times a second in the simulator: nothing is allocated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tokenfair.core.batch import ScheduledRequest
from tokenfair.core.policies.base import Policy
from tokenfair.core.request import Request
from tokenfair.core.scheduler_config import SchedulerConfig


def newcomer_chunk(limit: int) -> int:
    """The other tenants' prompt tokens, together, in a step giving a newly started
    request its first token. An eighth of the limit: on the A10G profile a quarter left
    the light tenants' TTFT p99 at 2.0x their alone figure, an eighth at 1.9x, for the
    same long prompts' throughput (docs/fairness.md)."""
    return max(1, limit // 8)


class StepShare:
    __slots__ = (
        "_newcomers",
        "_parts",
        "_policy",
        "_running",
        "_started",
        "_taken",
        "_tenants",
        "limit",
    )

    def __init__(self, limit: int, policy: Policy) -> None:
        self.limit = limit
        self._policy = policy
        self._running: Sequence[Request] = ()
        self._taken: dict[str, int] = {}  # prompt tokens each tenant took in this step
        self._tenants: set[str] | None = None  # who has work: found once, when needed
        # Each prefilling tenant's part of the limit: found once, when needed.
        self._parts: dict[str, float] | None = None
        self._started: set[str] = set()  # requests starting whole in this step, by id
        self._newcomers = 0  # the prompt tokens of the requests starting whole in this step

    @classmethod
    def for_config(cls, config: SchedulerConfig, policy: Policy) -> StepShare | None:
        """The step share of a scheduler with these settings (None: steps not shared)."""
        if config.step_share_tokens is None or not config.enable_chunked_prefill:
            return None
        return cls(config.step_share_tokens, policy)

    def begin(self, running: Sequence[Request]) -> None:
        """A step is about to be planned over these running requests."""
        self._running = running
        self._taken.clear()
        self._started.clear()
        self._tenants = None
        self._parts = None
        self._newcomers = 0

    def allow(self, tenant: str, tokens: int, starts: bool = False) -> int:
        """How many of a prompt chunk of `tokens` the tenant may run in this step
        (`count` them once planned). `starts`: the chunk is a newly admitted request's
        whole prompt, which runs at once if it fits the limit."""
        if not self._others_present(tenant):
            return tokens
        taken = self._taken.get(tenant, 0)
        if starts and self._newcomers + tokens <= self.limit:
            self._newcomers += tokens
            return tokens  # the others are cut for it (cut_for_newcomers)
        part = max(1, int(self._part(tenant))) - taken  # a token at least: never stuck
        left = self.limit - sum(self._taken.values())  # the step's prompt tokens left
        return max(0, min(tokens, part, left))

    def count(self, tenant: str, tokens: int) -> None:
        """A prompt chunk of `tokens` was planned for the tenant."""
        self._taken[tenant] = self._taken.get(tenant, 0) + tokens

    def give_back(self, tenant: str, tokens: int) -> None:
        """A request's `tokens` left the step (it was pushed out)."""
        if tokens > 1:  # a prompt chunk (a swapped-in one was never counted)
            self._taken[tenant] = max(0, self._taken.get(tenant, 0) - tokens)

    def _others_present(self, tenant: str) -> bool:
        tenants = self._tenants
        if tenants is None:  # the tenants running and waiting (admitted ones were either)
            tenants = self._tenants = {request.client for request in self._running}
            tenants.update(self._policy.waiting_tenants())
        return len(tenants) > 1 or (bool(tenants) and tenant not in tenants)

    def _part(self, tenant: str) -> float:
        """The tenant's part of the limit: the limit water-filled by weight over what
        the tenants ask of it (a tenant in prefill, the tokens its running requests have
        left to prefill; a tenant with a request waiting, the whole limit)."""
        parts = self._parts
        if parts is None:
            asks: dict[str, int] = {}
            for request in self._running:
                # A recomputed request prefills its generated tokens again too.
                left = (
                    request.input_tokens + request.num_output_tokens - request.num_computed_tokens
                )
                if left > 1:
                    asks[request.client] = asks.get(request.client, 0) + left
            for waiting in sorted(self._policy.waiting_tenants()):  # the same in every process
                asks[waiting] = max(asks.get(waiting, 0), self.limit)
            parts = self._parts = _water_fill(self.limit, asks, self._policy.weights_in_use())
        return parts.get(tenant, 0.0)

    def admitted(self, request: Request, tokens: int, first_token: bool) -> None:
        """`request` was admitted with a chunk of `tokens`; `first_token`: the chunk
        ends its prompt, so it gets its first token from this step."""
        if tokens > 1:
            self.count(request.client, tokens)
            if first_token:
                self._started.add(request.request_id)

    def cut_for_newcomers(self, scheduled: list[ScheduledRequest]) -> None:
        """In a step that gives a newly started request its first token, cut the step's
        other prompt chunks to an eighth of the limit together."""
        started = self._started
        if not started:
            return
        others = [
            planned
            for planned in scheduled
            if planned.num_new_tokens > 1 and planned.request.request_id not in started
        ]
        if not others:
            return
        each = max(1, newcomer_chunk(self.limit) // len(others))
        for planned in others:
            if planned.num_new_tokens > each:
                planned.num_new_tokens = each  # a prompt chunk (a decode is one token)

    def top_up(
        self,
        scheduled: list[ScheduledRequest],
        budget: int,
        allocate: Callable[[Request, int], list[int] | None],
    ) -> None:
        """Give the step share that tenants waiting could not use (none of their
        requests could start) to the running prefills, in plan order, so that a step
        carries a whole share while a tenant is in prefill. Not in a step where a
        request starts (it stays short for it), never beyond `budget` tokens, and only
        as far as `allocate` finds blocks."""
        if self._started or self._parts is None:
            return  # a newcomer's step, or nobody's chunk was capped
        left = min(self.limit - sum(self._taken.values()), budget)
        for planned in scheduled:
            if left <= 0:
                return
            request = planned.request
            end = planned.start + planned.num_new_tokens
            extra = min(request.num_tokens - end, left)
            if extra <= 0 or allocate(request, end + extra) is None:
                continue  # a decode, a whole prompt, or a pool too short to grow
            planned.num_new_tokens += extra
            self.count(request.client, extra)
            left -= extra


def _water_fill(
    total: int, asks: Mapping[str, int], weights: Mapping[str, float]
) -> dict[str, float]:
    """`total` shared by weight, max-min, over what each tenant `asks`: a tenant asking
    less than its part gets what it asks, the rest goes to the others."""
    parts: dict[str, float] = {}
    left = float(total)
    weight_left = sum(weights.get(tenant, 1.0) for tenant in asks)
    for tenant in sorted(asks, key=lambda t: asks[t] / weights.get(t, 1.0)):
        weight = weights.get(tenant, 1.0)
        part = left * weight / weight_left
        parts[tenant] = min(float(asks[tenant]), part)
        left -= parts[tenant]
        weight_left -= weight
    return parts
