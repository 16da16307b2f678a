"""/metrics: vLLM-style names under tokenfair:, tenant labels (the dashboard's queries are
checked against the server and the gateway in tests/gateway/test_metric_vocabulary.py)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tokenfair.core.request import FinishReason, Request
from tokenfair.engine.engine import RequestOutput
from tokenfair.engine.stats import EngineStats
from tokenfair.server.metrics import ServerMetrics

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


def _samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render(EngineStats()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _choice(rid: str, prompt_tokens: int) -> Request:
    return Request(request_id=rid, client="t", input_tokens=prompt_tokens, arrival_s=0.0)


def _step(metrics: ServerMetrics, *outputs: tuple[Request, int, FinishReason | None]) -> None:
    """One engine step: each request gains `tokens`, and ends when given a reason."""
    done = []
    for request, tokens, reason in outputs:
        if reason is not None:
            request.finish_reason = reason
        done.append(RequestOutput(request, [7] * tokens, finished=reason is not None))
    metrics.on_step(done, now=1.0)


def test_a_request_of_several_choices_is_one_request_with_its_prompts_once() -> None:
    """Two prompts x n=2: four engine requests, one request. The request-level families
    count it once, each prompt once (as usage reports it); the choice families count
    what the engine ran."""
    metrics = ServerMetrics()
    a0, a1, b0, b1 = _choice("a0", 5), _choice("a1", 5), _choice("b0", 3), _choice("b1", 3)
    metrics.choices(["a0", "a1", "b0", "b1"], per_prompt=2)
    _step(metrics, (a1, 1, None), (b0, 1, None))
    _step(metrics, (a0, 1, None), (b1, 2, FinishReason.LENGTH))
    _step(metrics, (a0, 1, FinishReason.STOP), (a1, 1, FinishReason.LENGTH))
    _step(metrics, (b0, 1, FinishReason.LENGTH))
    got = _samples(metrics)
    tenant = (("tenant", "t"),)
    assert got[("tokenfair:request_success_total", (("finished_reason", "stop"), *tenant))] == 1
    assert ("tokenfair:request_success_total", (("finished_reason", "length"), *tenant)) not in got
    assert got[("tokenfair:prompt_tokens_total", tenant)] == 5 + 3
    assert got[("tokenfair:generation_tokens_total", tenant)] == 8
    assert got[("tokenfair:time_to_first_token_seconds_count", tenant)] == 1
    assert got[("tokenfair:e2e_request_latency_seconds_count", tenant)] == 1
    assert got[("tokenfair:choice_prompt_tokens_total", tenant)] == 2 * 5 + 2 * 3
    assert got[("tokenfair:choice_success_total", (("finished_reason", "length"), *tenant))] == 3
    assert got[("tokenfair:choice_success_total", (("finished_reason", "stop"), *tenant))] == 1
    # The tenant's counter pays for the prompt once per choice: the engine computed it so.
    assert got[("tokenfair:tenant_service_total", tenant)] == 2 * 5 + 2 * 3 + 2 * 8


def test_a_request_refused_whole_or_timed_out_is_not_a_success() -> None:
    metrics = ServerMetrics()
    # Refused at its third choice: the two admitted end as aborts, at the choice level.
    r0, r1 = _choice("r0", 4), _choice("r1", 4)
    metrics.choices(["r0", "r1", "r2"], per_prompt=3)
    metrics.reject("t", "tenant_queue_full")  # as `start` counts the refusal
    metrics.choices_refused(["r0", "r1", "r2"], submitted=["r0", "r1"])
    _step(metrics, (r0, 0, FinishReason.ABORT), (r1, 0, FinishReason.ABORT))
    # One choice of another request times out: the request is one error.
    t0, t1 = _choice("t0", 2), _choice("t1", 2)
    metrics.choices(["t0", "t1"], per_prompt=2)
    _step(metrics, (t0, 1, None), (t1, 1, None))
    metrics.timed_out("t1")
    _step(metrics, (t0, 1, FinishReason.ABORT), (t1, 0, FinishReason.ABORT))
    got = _samples(metrics)
    tenant = (("tenant", "t"),)
    assert not [key for key in got if key[0] == "tokenfair:request_success_total"]
    assert got[("tokenfair:requests_rejected_total", (("reason", "tenant_queue_full"), *tenant))]
    assert got[("tokenfair:request_errors_total", (("reason", "timeout"), *tenant))] == 1
    assert got[("tokenfair:choice_success_total", (("finished_reason", "abort"), *tenant))] == 3
    assert got[("tokenfair:prompt_tokens_total", tenant)] == 2
    assert got[("tokenfair:e2e_request_latency_seconds_count", tenant)] == 1
    assert not metrics._answers and not metrics._quiet  # nothing kept once they ended
