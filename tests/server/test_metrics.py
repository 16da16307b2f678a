"""/metrics: vLLM-style names under tokenfair:, tenant labels (the dashboard's queries are
checked against the server and the gateway in tests/gateway/test_metric_vocabulary.py)."""

from __future__ import annotations

import httpx

REQUIRED = {
    "tokenfair:num_requests_running",
    "tokenfair:num_requests_waiting",
    "tokenfair:kv_cache_usage_perc",
    "tokenfair:num_preemptions_total",
    "tokenfair:prompt_tokens_total",
    "tokenfair:generation_tokens_total",
    "tokenfair:time_to_first_token_seconds_bucket",
    "tokenfair:inter_token_latency_seconds_bucket",
    "tokenfair:e2e_request_latency_seconds_bucket",
    "tokenfair:vtc_counter",
    "tokenfair:tenant_service_total",
    "tokenfair:build_info",
}


def test_metrics_names_labels_and_values(sim_server):
    before = sim_server.metric("tokenfair:generation_tokens_total", tenant="team-b")
    r = httpx.post(
        f"{sim_server.url}/v1/completions",
        json={"model": "sim:fixed:0.002", "prompt": "count me", "max_tokens": 5},
        headers=sim_server.headers("team-b"),
        timeout=30,
    )
    assert r.status_code == 200
    metrics = sim_server.metrics()
    names = {name for name, _ in metrics}
    assert names >= REQUIRED
    assert sim_server.metric("tokenfair:generation_tokens_total", tenant="team-b") - before == 5
    # Every tenant of the file has its series, even one that never sent anything.
    assert ("tokenfair:vtc_counter", (("tenant", "slow"),)) in metrics
    assert sim_server.metric("tokenfair:vtc_counter", tenant="team-b") > 0
    assert sim_server.metric("tokenfair:tenant_service_total", tenant="team-b") > 0
    ttft_count = sim_server.metric("tokenfair:time_to_first_token_seconds_count", tenant="team-b")
    assert ttft_count >= 1
