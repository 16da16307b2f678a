"""An upstream's load: read from its /metrics with prometheus_client's parser, and one slot
per choice of a request."""

from __future__ import annotations

from tokenfair.gateway.config import UpstreamConfig
from tokenfair.gateway.upstreams.pool import Upstream, parse_load

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


def upstream(max_concurrent: int) -> Upstream:
    config = UpstreamConfig(
        url="http://127.0.0.1:9", name="u", models=["m"], max_concurrent=max_concurrent
    )
    return Upstream(config)


def test_a_request_holds_one_slot_per_choice() -> None:
    u = upstream(4)
    assert u.has_room(10, seats=4)
    u.acquire(10, seats=3)
    assert u.running == 3
    assert u.has_room(10, seats=1) and not u.has_room(10, seats=2)
    u.release(10, seats=3)
    assert u.running == 0 and u.has_room(10, seats=4)


def test_a_request_wider_than_the_upstream_goes_only_when_it_is_idle() -> None:
    u = upstream(4)
    assert u.has_room(10, seats=6)  # idle: it runs alone rather than never
    u.acquire(10, seats=1)
    assert not u.has_room(10, seats=6)
