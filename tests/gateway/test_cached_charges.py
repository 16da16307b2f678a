"""The gateway prices prompt tokens its upstream served from the prefix cache at
`cost.charge_cached_tokens`, from the usage the upstream reports."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway.processes import gateway, sim_upstream, state
from tokenfair.core.cost import LinearCost
from tokenfair.gateway.flow.meter import Meter
from tokenfair.gateway.transport.sse import usage_of

pytestmark = pytest.mark.slow

SYSTEM = "You are the assistant of tenant a; answer briefly and cite sources. " * 24


def test_usage_reads_the_cached_prompt_tokens():
    usage = {"prompt_tokens": 100, "completion_tokens": 5}
    assert usage_of({"usage": usage}) == (100, 5, 0)
    cached = {**usage, "prompt_tokens_details": {"cached_tokens": 64}}
    assert usage_of({"usage": cached}) == (100, 5, 64)
    odd = {**usage, "prompt_tokens_details": {"cached_tokens": 900}}
    assert usage_of({"usage": odd}) == (100, 5, 100)


def test_a_meter_prices_cached_prompt_tokens_at_its_share():
    meter = Meter(None, (("a", 1.0),), LinearCost(), 100, 10, stream=False, cached_share=0.25)
    meter.on_usage(100, 10, cached_tokens=64)
    assert meter.service() == pytest.approx(100 - 0.75 * 64 + 2 * 10)
    meter.on_unfinished(failed=True)  # usage seen: nothing changes
    assert meter.service() == pytest.approx(100 - 0.75 * 64 + 2 * 10)


@pytest.mark.parametrize("share", [1.0, 0.0])
def test_cached_prompt_tokens_cost_the_configured_share(tmp_path: Path, share: float):
    upstream = sim_upstream(
        tmp_path, "sim", "--enable-prefix-caching", "--tenant-from-user", profile="zero"
    )
    gw = None
    try:
        gw = gateway(
            tmp_path,
            [{"url": upstream.url, "models": ["sim"], "max_concurrent": 4}],
            tenants=None,
            tenant_from_user=True,
            cost={"charge_cached_tokens": share},
        )
        details = []
        for question in ("first question?", "second question?"):
            body = {"model": "sim", "prompt": SYSTEM + question, "max_tokens": 4, "user": "a"}
            answer = httpx.post(gw.url + "/v1/completions", json=body, timeout=30).json()
            details.append(answer["usage"])
        cached = details[1]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 300  # the shared system prompt, found in the upstream's cache
        full = sum(u["prompt_tokens"] + 2 * u["completion_tokens"] for u in details)
        assert state(gw)["counters"]["a"] == pytest.approx(full - (1 - share) * cached)
    finally:
        if gw is not None:
            gw.stop()
        upstream.stop()
