"""Prefix-affinity routing over real `tokenfair serve --model sim:` upstreams with prefix
caching on, and two gateway replicas sharing a real Redis.

Upstream load is held with streams that cannot end for seconds (1,000 tokens at 10 ms
a step) and are closed by the test, so which upstreams are busy at each request is set
by the test, not by timing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.processes import KEYS, Process, gateway, metrics, sim_upstream, state
from tests.gateway.redis_server import RedisServer

pytestmark = pytest.mark.slow

SYSTEM = "You are the archivist of a maritime museum; cite the catalogue number. " * 12
NAMES = ["sim0", "sim1", "sim2"]


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("prefix-routing")
    ups = [sim_upstream(tmp, name, "--enable-prefix-caching") for name in NAMES]
    try:
        yield {"tmp": tmp, "upstreams": dict(zip(NAMES, ups, strict=True))}
    finally:
        for u in ups:
            u.stop()


def _configs(sims: dict[str, Any], order: list[str] = NAMES) -> list[dict[str, Any]]:
    return [
        {"url": sims["upstreams"][name].url, "models": ["sim"], "max_concurrent": 4, "name": name}
        for name in order
    ]


def _messages(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def _ask(gw: Process, tenant: str, messages: list[dict[str, str]]) -> None:
    response = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "sim", "messages": messages, "max_tokens": 2},
        headers={"authorization": f"Bearer {KEYS[tenant]}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text


def _hold(
    stack: contextlib.ExitStack, http: httpx.Client, gw: Process, tenant: str, q: str
) -> None:
    """Open a long stream and return once it is running upstream (its first event)."""
    response = stack.enter_context(
        http.stream(
            "POST",
            gw.url + "/v1/chat/completions",
            json={"model": "sim", "messages": _messages(q), "max_tokens": 1000, "stream": True},
            headers={"authorization": f"Bearer {KEYS[tenant]}"},
        )
    )
    assert response.status_code == 200
    lines = response.iter_lines()
    stack.callback(lines.close)  # keeps the stream open: a dropped iterator closes it
    assert next(line for line in lines if line).startswith("data: {")


def _upstreams_of(gw: Process, tenant: str, n: int) -> list[str]:
    rows = httpx.get(
        gw.metrics_url + "/v1/gateway/requests/recent",
        params={"tenant": tenant, "limit": n},
        timeout=5,
    ).json()["data"]
    assert len(rows) == n
    return [row["upstream"] for row in rows]


def _cache(sims: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each upstream's prefix-cache (hits, queries) in tokens."""
    out = {}
    for name, upstream in sims["upstreams"].items():
        values = metrics(upstream)
        out[name] = (
            values.get(("tokenfair:prefix_cache_hits_total", ()), 0.0),
            values.get(("tokenfair:prefix_cache_queries_total", ()), 0.0),
        )
    return out


def _decisions(gw: Process) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["upstream"], dict(labels)["reason"]): value
        for (name, labels), value in metrics(gw).items()
        if name == "tokenfair:gateway_route_decisions_total"
    }


def _waves(sims: dict[str, Any], gw: Process, tenant: str) -> list[str]:
    """Four waves of two requests under one system prompt: a long stream held open, and
    while it runs a short request; the stream closes before the next wave."""
    with httpx.Client(timeout=60) as http:
        for wave in range(4):
            with contextlib.ExitStack() as stack:
                _hold(stack, http, gw, tenant, f"Catalogue entry {wave}, in full.")
                _ask(gw, tenant, _messages(f"Who donated item {wave}?"))
    return _upstreams_of(gw, tenant, 8)


def test_a_tenants_shared_prefix_lands_on_one_upstream(sims: dict[str, Any]) -> None:
    affine = gateway(sims["tmp"], _configs(sims), name="affine", routing="prefix-affinity")
    least = gateway(sims["tmp"], _configs(sims), name="least", routing="least-loaded")
    try:
        before = _cache(sims)
        used = _waves(sims, affine, "light")
        after = _cache(sims)
        assert len(set(used)) == 1, used
        home = used[0]
        system_tokens = len(f"system: {SYSTEM}\n".encode()) // 4
        hits = {name: after[name][0] - before[name][0] for name in NAMES}
        queries = {name: after[name][1] - before[name][1] for name in NAMES}
        assert hits[home] >= 7 * (system_tokens // 16) * 16  # every request after the first
        assert all(queries[name] == 0 for name in NAMES if name != home)
        decisions = _decisions(affine)
        assert decisions[(home, "first_placement")] == 1
        assert decisions[(home, "affinity")] == 7
        values = metrics(affine)
        blocks = values[("tokenfair:gateway_prefix_blocks_total", (("upstream", home),))]
        matched = values[("tokenfair:gateway_prefix_matched_blocks_total", (("upstream", home),))]
        assert 0.8 < matched / blocks < 1  # the estimate: all but the first request's blocks

        # Least-loaded sends the short request of each wave away from the busy upstream.
        spread = _waves(sims, least, "other")
        assert len(set(spread)) >= 2, spread
        assert _decisions(least)[(spread[1], "least_loaded")] >= 1
    finally:
        affine.stop()
        least.stop()


def test_an_overloaded_upstream_is_passed_over_and_nothing_waits_while_one_has_room(
    sims: dict[str, Any],
) -> None:
    gw = gateway(sims["tmp"], _configs(sims), name="overload")
    try:
        with httpx.Client(timeout=60) as http, contextlib.ExitStack() as stack:
            # 4 slots each, bound 0.25: the home takes a second stream (1 of 4 ahead of
            # the others), not a third (2 of 4 ahead): that one is diverted.
            for i in range(3):
                _hold(stack, http, gw, "heavy", f"Describe ship model {i}.")
            first, second, third = _upstreams_of(gw, "heavy", 3)
            assert first == second != third
            assert _decisions(gw)[(third, "overload_diversion")] == 1
            # All 12 slots fill before anything waits.
            for i in range(3, 12):
                _hold(stack, http, gw, "heavy", f"Describe ship model {i}.")
            running = state(gw)["upstreams"]
            assert [running[name]["running"] for name in NAMES] == [4, 4, 4]
            assert state(gw)["waiting"] == {}
    finally:
        gw.stop()


def test_two_replicas_sharing_redis_place_a_prefix_on_the_same_upstream(
    sims: dict[str, Any], redis_server: RedisServer
) -> None:
    """Each replica keeps its own index; a new prefix's home comes from rendezvous
    hashing of the tenant, model and first block over the upstream names, which each
    replica (its own process, its own hash seed, its upstreams listed in another order)
    computes alike."""
    shared = {"redis": {"url": redis_server.url, "namespace": "routing"}}
    first = gateway(sims["tmp"], _configs(sims), name="replica-a", **shared)
    second = gateway(sims["tmp"], _configs(sims, NAMES[::-1]), name="replica-b", **shared)
    try:
        tenants = ["light", "heavy", "other"]
        for i in range(9):
            messages = _messages("Which deck?", system=f"Exhibit {i} guide. " * 30)
            _ask(first, tenants[i % 3], messages)
            _ask(second, tenants[i % 3], messages)
        for tenant in tenants:
            assert _upstreams_of(first, tenant, 3) == _upstreams_of(second, tenant, 3)
        homes = {u for tenant in tenants for u in _upstreams_of(first, tenant, 3)}
        assert len(homes) >= 2  # the prefixes spread: agreeing was not trivial
        for gw in (first, second):
            placed = sum(
                v for (_, reason), v in _decisions(gw).items() if reason == "first_placement"
            )
            assert placed == 9
    finally:
        first.stop()
        second.stop()
