"""The example policy (examples/least_attained.py), named by `module:Class` in the
plugin's settings, orders vLLM's own queue as it orders tokenfair's scheduler."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from vllm.v1.core.sched.scheduler import Scheduler

from tests.integrations.vllm.harness import make_scheduler
from tests.integrations.vllm.test_scheduler import (
    LATE,
    WORKLOAD,
    expected_counter,
    start_order_tokenfair,
    start_order_vllm,
)
from tokenfair.integrations.vllm import FairScheduler

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# No decay: vLLM's clock and the core run's differ, and the order must not depend on it.
SPEC = "least_attained:LeastAttainedService(half_life_s=None)"


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    sys.modules.pop("least_attained", None)


@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_the_example_orders_vllms_queue_as_it_orders_tokenfairs(tiny_model_dir, max_num_seqs):
    fair = make_scheduler(
        tiny_model_dir, FairScheduler, max_num_seqs=max_num_seqs, tokenfair={"policy": SPEC}
    )
    assert type(fair.plugin_policy.policy).__name__ == "LeastAttainedService"
    order = start_order_vllm(fair)
    assert order == start_order_tokenfair(max_num_seqs, SPEC)
    stock = start_order_vllm(make_scheduler(tiny_model_dir, Scheduler, max_num_seqs=max_num_seqs))
    assert order != stock  # it did reorder vLLM's arrival order
    # Each tenant attained its prompts and twice its output tokens, counted from what
    # vLLM reported (the first token of each request included: vLLM charges it).
    attained = fair.plugin_policy.policy.attained()
    for tenant in "abc":
        assert attained[tenant] == expected_counter(WORKLOAD, tenant)
    assert attained["d"] == expected_counter(LATE, "d")
