"""What one request costs its tenant, charged as it happens.

At dispatch the tenant pays for the prompt (counted or estimated) and, for a request
that does not stream, for its whole max_tokens. A stream pays for output chunk by
chunk. The usage the upstream reports at the end replaces both estimates, its prompt
tokens served from the upstream's prefix cache priced at `cached_share` of a computed
one (the gateway's `cost.charge_cached_tokens`). A request
whose upstream fails before any output is refunded in full; a non-streaming one that
ends without usage (failure, client gone) gets its unused output reservation back.

Every charge goes through the fairness seam of the tenant's band (`Fairness.charge`,
fairness.py), the one door to the counters; a seam without counters (the core's
ordering policies) takes nothing. A charge never waits, so a streamed chunk is charged
without an await.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenfair.core.cost import LinearCost
from tokenfair.core.policies.ledger import Charge, weighted_charge

if TYPE_CHECKING:
    from tokenfair.gateway.flow.fairness import Fairness


class Meter:
    __slots__ = (
        "cached",
        "cached_share",
        "cost",
        "fairness",
        "output",
        "per_output_token",
        "prompt",
        "stream",
        "streamed",
        "usage_seen",
        "weights",
    )

    def __init__(
        self,
        fairness: Fairness | None,
        weights: tuple[tuple[str, float], ...],
        cost: LinearCost,
        prompt_tokens: int,
        max_tokens: int,
        stream: bool,
        cached_share: float = 1.0,
    ) -> None:
        self.fairness = fairness  # what charges the tenant's band (None: nothing)
        self.cached_share = cached_share
        # (node, weight) from the tenant's top-level group down to the tenant itself.
        self.weights = weights
        self.cost = cost
        self.stream = stream
        self.prompt = prompt_tokens  # input tokens charged so far
        self.cached = 0  # of those, served from the upstream's prefix cache
        self.output = 0 if stream else max_tokens  # output tokens charged so far
        self.streamed = 0  # output tokens seen in chunks
        self.usage_seen = False
        # What one streamed output token costs each node: charged on every chunk, so
        # worked out once here.
        self.per_output_token = self._weighted(cost.w_out)

    def _service(self, prompt: float, output: float) -> float:
        return self.cost.w_in * prompt + self.cost.w_out * output

    def _charged_prompt(self) -> float:
        """The prompt as charged: cached tokens at their share."""
        return self.prompt - (1.0 - self.cached_share) * self.cached

    def _weighted(self, service: float) -> Charge:
        """`service` as each node on the tenant's path pays it (the ledger's rule)."""
        return weighted_charge(self.weights, service)

    def dispatch_charge(self) -> Charge:
        """Charged in the same atomic step that picks the request."""
        return self._weighted(self._service(self.prompt, self.output))

    def _charge(self, service: float) -> None:
        if self.fairness is not None and service:
            self.fairness.charge(self._weighted(service))

    def on_chunk(self, tokens: int) -> None:
        self.streamed += tokens
        if self.stream and not self.usage_seen:
            self.output += tokens
            if tokens != 1:
                self._charge(self._service(0, tokens))
            elif self.fairness is not None and self.cost.w_out:  # the usual chunk
                self.fairness.charge(self.per_output_token)

    def on_usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        before = self._charged_prompt()
        self.prompt, self.cached = prompt_tokens, cached_tokens
        self._charge(
            self._service(self._charged_prompt() - before, completion_tokens - self.output)
        )
        self.output = completion_tokens
        self.usage_seen = True

    def on_unfinished(self, failed: bool) -> None:
        """The request ended without usage: the upstream failed, or the client left.

        A client that leaves keeps paying for its prompt (the upstream prefilled it).
        """
        if self.usage_seen:
            return
        if failed and self.streamed == 0:  # nothing came back: nothing was served
            self._charge(-self._service(self._charged_prompt(), self.output))
            self.prompt = self.output = self.cached = 0
        elif not self.stream:
            self._charge(-self._service(0, self.output - self.streamed))
            self.output = self.streamed

    def service(self) -> float:
        """Service received (unweighted), SPEC section 2, as charged."""
        return self._service(self._charged_prompt(), self.output)
