"""The upstream's load read from its /metrics with prometheus_client's parser."""

from __future__ import annotations

from tokenfair.gateway.upstreams.pool import parse_load

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# HELP vllm:num_requests_running_total A name that only starts like it.
# TYPE vllm:num_requests_running_total counter
vllm:num_requests_running_total{model_name="m"} 99.0
# TYPE tokenfair:num_requests_running gauge
tokenfair:num_requests_running{tenant="a"} 4.0
tokenfair:num_requests_running{tenant="b"} 1.0
"""


def test_running_and_waiting_are_summed_over_every_series():
    assert parse_load(VLLM_METRICS, "vllm") == (5.0, 7.0)
    assert parse_load(VLLM_METRICS, "tokenfair") == (5.0, 0.0)


def test_text_that_is_not_metrics_counts_nothing():
    assert parse_load("<html>not found</html>", "vllm") == (0.0, 0.0)
