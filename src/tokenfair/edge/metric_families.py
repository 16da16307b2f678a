"""The serving metrics' families, defined once for the server and the gateway: vLLM's
names under `tokenfair:`, with their help text, labels and (histograms) buckets.

Both processes expose every family here under the same name, type and labels (the
request-level ones through `tenant_metrics.TenantMetrics`, the live gauges through its
helpers), so a dashboard or an alert written for one works on the other. A family
that only one of them can fill (KV cache, preemptions; upstreams, leases) is its own,
outside this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

# Latency buckets (seconds): from a token that comes at once to a request of minutes.
LATENCY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    documentation: str
    labels: tuple[str, ...] = ("tenant",)
    buckets: tuple[float, ...] = ()  # histograms only

    def gauge(self) -> GaugeMetricFamily:
        """An empty gauge family to fill at scrape time."""
        return GaugeMetricFamily(self.name, self.documentation, labels=list(self.labels))


# Which process this is: `role` is "server" or "gateway" (a dashboard's instance list).
BUILD_INFO = Family(
    "tokenfair:build_info", "tokenfair's version and role; always 1.", ("role", "version")
)
# Per tenant, counters: what it was served, and how its requests ended.
PROMPT_TOKENS = Family("tokenfair:prompt_tokens", "Prompt tokens served.")
GENERATION_TOKENS = Family("tokenfair:generation_tokens", "Tokens generated.")
TENANT_SERVICE = Family(
    "tokenfair:tenant_service",
    "Weighted service received (w_in x prompt + w_out x generated tokens).",
)
REQUEST_SUCCESS = Family(
    "tokenfair:request_success",
    "Requests answered and ended, by how: stop, length, or abort (the client went away, "
    "or an operator aborted it).",
    ("tenant", "finished_reason"),
)
REQUESTS_REJECTED = Family(
    "tokenfair:requests_rejected",
    "Requests refused before they ran (bad input, limits, the policy: a 4xx; overload or no upstream: a 503), by error code.",
    ("tenant", "reason"),
)
REQUEST_ERRORS = Family(
    "tokenfair:request_errors",
    "Requests accepted that ended in an error (a timeout, an upstream or engine failure), "
    "by error code.",
    ("tenant", "reason"),
)
# Per tenant, gauges: where its requests are.
NUM_REQUESTS_WAITING = Family("tokenfair:num_requests_waiting", "Requests waiting to be admitted.")
NUM_REQUESTS_RUNNING = Family("tokenfair:num_requests_running", "Requests admitted and running.")
# Per tenant, histograms: latencies.
TIME_TO_FIRST_TOKEN = Family(
    "tokenfair:time_to_first_token_seconds", "Arrival to first token.", buckets=LATENCY_BUCKETS
)
INTER_TOKEN_LATENCY = Family(
    "tokenfair:inter_token_latency_seconds",
    "Time between two tokens of one request (the gateway: between two chunks).",
    buckets=TOKEN_LATENCY_BUCKETS,
)
E2E_REQUEST_LATENCY = Family(
    "tokenfair:e2e_request_latency_seconds", "Arrival to finish.", buckets=LATENCY_BUCKETS
)
REQUEST_QUEUE_TIME = Family(
    "tokenfair:request_queue_time_seconds",
    "Arrival to admission: time spent waiting.",
    buckets=LATENCY_BUCKETS,
)
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
