"""/metrics: vLLM-style names under tokenfair:, tenant labels, and the dashboard reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-tokenfair.json"
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
    "tokenfair:tenant_service",
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
    assert sim_server.metric("tokenfair:tenant_service", tenant="team-b") > 0
    ttft_count = sim_server.metric("tokenfair:time_to_first_token_seconds_count", tenant="team-b")
    assert ttft_count >= 1


def test_dashboard_reads_only_metrics_the_server_exports(sim_server):
    exported = {name for name, _ in sim_server.metrics()}
    text = httpx.get(f"{sim_server.url}/metrics").text
    # Families declared but without samples yet (labelled counters nobody has hit).
    exported |= set(re.findall(r"^# TYPE (tokenfair:[a-z0-9_]+) counter", text, re.M))
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {m for expr in exprs for m in re.findall(r"tokenfair:[a-z0-9_]+", expr)}
    assert used, "the dashboard queries tokenfair metrics"
    assert used <= exported, used - exported
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("service rate", "ttft p50", "ttft p90", "queue depth", "kv cache", "preemptions"):
        assert topic in titles
