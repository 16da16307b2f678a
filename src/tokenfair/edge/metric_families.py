"""The serving metrics' families, defined once for the server and the gateway: vLLM's
names under `tokenfair:`, with their help text and labels.

Each process builds its series from these (a counter, a gauge read at scrape time, a
histogram), so a name or a label changes in one place for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    documentation: str
    labels: tuple[str, ...] = ("tenant",)

    def counter(
        self, registry: CollectorRegistry, labels: tuple[str, ...] | None = None
    ) -> PromCounter:
        """A counter (its samples get prometheus_client's `_total`)."""
        return PromCounter(
            self.name, self.documentation, list(labels or self.labels), registry=registry
        )

    def gauge(self) -> GaugeMetricFamily:
        """An empty gauge family to fill at scrape time."""
        return GaugeMetricFamily(self.name, self.documentation, labels=list(self.labels))


# Per tenant: what it was served.
PROMPT_TOKENS = Family("tokenfair:prompt_tokens", "Prompt tokens served.")
GENERATION_TOKENS = Family("tokenfair:generation_tokens", "Tokens generated.")
REQUEST_SUCCESS = Family(
    "tokenfair:request_success", "Requests finished, by how.", ("tenant", "finished_reason")
)
REQUESTS_REJECTED = Family(
    "tokenfair:requests_rejected",
    "Requests refused before running (waiting limits, rate limits, the policy, bad input), "
    "by error code.",
    ("tenant", "reason"),
)
TENANT_SERVICE = Family(
    "tokenfair:tenant_service",
    "Weighted service received (w_in x prompt + w_out x generated tokens).",
)
# Per tenant: where its requests are.
NUM_REQUESTS_WAITING = Family("tokenfair:num_requests_waiting", "Requests waiting to be admitted.")
NUM_REQUESTS_RUNNING = Family("tokenfair:num_requests_running", "Requests admitted and running.")
# Per tenant: latencies (histograms).
TIME_TO_FIRST_TOKEN = Family("tokenfair:time_to_first_token_seconds", "Arrival to first token.")
E2E_REQUEST_LATENCY = Family("tokenfair:e2e_request_latency_seconds", "Arrival to finish.")
REQUEST_QUEUE_TIME = Family("tokenfair:request_queue_time_seconds", "Time spent waiting.")
# Fair shares: per tenant, and per group of tenants (by the group's path).
VTC_COUNTER = Family("tokenfair:vtc_counter", "The tenant's virtual token counter.")
TENANT_WEIGHT = Family("tokenfair:tenant_weight", "The tenant's fair-share weight.")
GROUP_VTC_COUNTER = Family(
    "tokenfair:group_vtc_counter", "The group's virtual token counter.", ("group",)
)
GROUP_WEIGHT = Family(
    "tokenfair:group_weight", "The group's fair-share weight among its siblings.", ("group",)
)
GROUP_SERVICE = Family(
    "tokenfair:group_service",
    "Weighted service received by the group's tenants (w_in x prompt + w_out x generated).",
    ("group",),
)
