"""vLLM's other ways into its waiting line (vLLM 0.34): the queue of requests that may
load their KV asynchronously, and the cache-aware admission window."""

from __future__ import annotations

import logging

import pytest

from tests.integrations.vllm.harness import add, make_request, make_scheduler, new_ids, run
from tokenfair.integrations.vllm import FairScheduler


def _needs(scheduler, attribute: str) -> None:
    if not hasattr(scheduler, attribute):
        pytest.skip(f"this vLLM's scheduler has no {attribute} (vLLM 0.34 added it)")


def test_async_load_requests_wait_in_the_fair_order_and_are_charged(tiny_model_dir):
    fair = make_scheduler(tiny_model_dir, FairScheduler, max_num_seqs=1)
    _needs(fair, "async_kv_waiting")
    add(fair, [make_request(fair, f"a{i}", "a", 32, 4) for i in range(3)])
    # What vLLM's _enqueue_waiting_request does with a request its KV connector may
    # load asynchronously (with --max-num-inflight-kv-loads).
    loader = make_request(fair, "b0", "b", 32, 4)
    fair.requests[loader.request_id] = loader
    fair.async_kv_waiting.add_request(loader)
    assert "b0" in [r.request_id for r in fair.waiting]  # one line, the policy's
    assert len(fair.async_kv_waiting) == 0 and bool(fair.async_kv_waiting)
    assert fair.get_request_counts() == (0, 4)  # each waiting request counted once
    # b (lifted to a's counter on arrival) goes as soon as a's first has been charged.
    order = [rid for output in run(fair) for rid in new_ids(output)]
    assert order == ["a0", "b0", "a1", "a2"]
    counters = fair.driver.counters()
    assert counters == {"a": 3 * (32 + 2 * 4), "b": 32 + 2 * 4}


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        ("fcfs", True),
        ("vtc", True),
        ("sjf", False),
        ("priority", False),
        ("dlpm", False),
        ("vtc-hit", False),
    ],
)
def test_the_cache_aware_window_is_kept_only_where_it_keeps_the_order(
    tiny_model_dir, policy, kept, caplog
):
    from vllm.engine.arg_utils import EngineArgs

    if "cache_aware_admission_window" not in EngineArgs.__dataclass_fields__:
        pytest.skip("this vLLM has no --cache-aware-admission-window (vLLM 0.34 added it)")
    with caplog.at_level(logging.WARNING):
        fair = make_scheduler(
            tiny_model_dir,
            FairScheduler,
            prefix_caching=True,
            cache_aware_window=8,
            tokenfair={"policy": policy},
        )
    assert fair.cache_aware_window == (8 if kept else 0)
    refused = [r for r in caplog.records if "cache-aware-admission-window is off" in r.message]
    assert len(refused) == (0 if kept else 1)
