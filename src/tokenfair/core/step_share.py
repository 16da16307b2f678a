"""One step's prompt tokens, shared among tenants while more than one has work.

A step lasts about as long as the tokens it carries: on the A10G profile a
3,500-token prefill chunk makes a step of 0.8 s instead of 0.04 s. Every running
request of every tenant advances one token per step, and a request that arrives waits
for the step under way to end, so a tenant whose long prompts fill the steps sets the
other tenants' time per output token and adds to their time to first token, whatever
their counters say (docs/fairness.md, "What a tenant holds").

While another tenant has requests running or waiting, one tenant's prompt chunks take
at most `limit` tokens of a step; the rest of its prompt goes in the next steps, and a
waiting request of a tenant that had its share of the step lets the next tenant's
start. In a step that gives another tenant's newly started request its first token, a
tenant's prompt chunks are cut to an eighth of the limit (`newcomer_chunk`), so that
the newcomer's first step is short too. A tenant alone takes the whole token budget. The limit is the trade
between the long prompts' prefill rate and the other tenants' decode pace, which on
these step-time models is about one for one (`SchedulerConfig.step_share_tokens`; the
figure in docs/fairness.md, "What a tenant holds").

One `StepShare` serves a scheduler for its whole life: `begin` clears it at each step
(the step runs thousands of times a second in the simulator: nothing is allocated).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenfair.core.batch import ScheduledRequest
from tokenfair.core.policies.base import Policy
from tokenfair.core.request import Request
from tokenfair.core.scheduler_config import SchedulerConfig


def newcomer_chunk(limit: int) -> int:
    """A tenant's prompt tokens in a step giving another tenant's request its first
    token. An eighth of the limit: on the A10G profile a quarter left the light
    tenants' TTFT p99 at 2.0x their alone figure, an eighth at 1.9x, for the same long
    prompts' throughput (docs/fairness.md)."""
    return max(1, limit // 8)


class StepShare:
    __slots__ = ("_policy", "_running", "_started", "_taken", "_tenants", "limit")

    def __init__(self, limit: int, policy: Policy) -> None:
        self.limit = limit
        self._policy = policy
        self._running: Sequence[Request] = ()
        self._taken: dict[str, int] = {}  # prompt tokens each tenant took in this step
        self._tenants: set[str] | None = None  # who has work: found once, when needed
        self._started: set[str] = set()  # tenants a request of which starts in this step

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

    def allow(self, tenant: str, tokens: int) -> int:
        """How many of a prompt chunk of `tokens` the tenant may run in this step
        (`count` them once planned)."""
        taken = self._taken.get(tenant, 0)
        if taken + tokens > self.limit and self._others_present(tenant):
            return max(0, self.limit - taken)
        return tokens

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

    def admitted(self, tenant: str, tokens: int, first_token: bool) -> None:
        """A request of `tenant` was admitted with a chunk of `tokens`; `first_token`:
        the chunk ends its prompt, so it gets its first token from this step."""
        if tokens > 1:
            self.count(tenant, tokens)
            if first_token:
                self._started.add(tenant)

    def cut_for_newcomers(self, scheduled: list[ScheduledRequest]) -> None:
        """In a step that gives a newly started request its first token, cut the other
        tenants' prompt chunks to an eighth of the limit."""
        started = self._started
        if not started:
            return
        small = newcomer_chunk(self.limit)
        for planned in scheduled:
            if planned.num_new_tokens > small and planned.request.client not in started:
                planned.num_new_tokens = small  # a prompt chunk (a decode is one token)
