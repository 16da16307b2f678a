"""The gateway's flow control: strict priority bands, VTC inside a band, and each
tenant's own requests in priority order, read from the gateway's dispatch record."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.processes import Process, fake_upstream, gateway
from tokenfair.edge.tenants import hash_key

pytestmark = pytest.mark.slow
KEYS = {"interactive": "key-i", "batch-a": "key-ba", "batch-b": "key-bb"}


def banded_tenants(tmp: Path, bands: bool = True) -> Path:
    tenants = [
        {"name": "interactive", "key_sha256": hash_key(KEYS["interactive"]), "band": 0},
        {"name": "batch-a", "key_sha256": hash_key(KEYS["batch-a"]), "weight": 2},
        {"name": "batch-b", "key_sha256": hash_key(KEYS["batch-b"])},
    ]
    for tenant in tenants[1:]:
        tenant["band"] = 1 if bands else 0
    for tenant in tenants:
        tenant["max_waiting"] = 1024
    path = tmp / f"tenants-{'banded' if bands else 'flat'}.yaml"
    path.write_text(yaml.safe_dump({"tenants": tenants}))
    return path


async def _loop(
    url: str, tenant: str, until: float, tokens: int, priority: int = 0, once: bool = False
) -> None:
    body: dict[str, Any] = {"model": "fake", "prompt": "hi", "max_tokens": tokens}
    if priority:
        body["priority"] = priority
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while once or time.monotonic() < until:
            answer = await client.post("/v1/completions", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            if once:
                return


async def _one(url: str, tenant: str, tokens: int, priority: int = 0) -> None:
    await _loop(url, tenant, time.monotonic() + 1e-9, tokens, priority, once=True)


async def _load(url: str, seconds: float, streams: dict[str, int]) -> None:
    until = time.monotonic() + seconds
    await asyncio.gather(
        *(_loop(url, tenant, until, 4) for tenant, n in streams.items() for _ in range(n))
    )


def recent(gw: Process, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return httpx.get(  # type: ignore[no-any-return]
        gw.metrics_url + "/v1/gateway/requests/recent",
        params={"limit": 1000},
        headers=headers,
        timeout=10,
    ).json()["data"]


def batch_dispatches_while_interactive_waited(rows: list[dict[str, Any]]) -> list[int]:
    """For each interactive dispatch, the batch dispatches made while it waited (the
    record is every dispatch in order: no retries here)."""
    found = []
    for index, row in enumerate(rows):
        if row["tenant"] == "interactive":
            ahead = rows[max(0, index - row["dispatched_ahead"]) : index]
            found.append(sum(other["tenant"] != "interactive" for other in ahead))
    return found


@pytest.fixture
def upstream(tmp_path: Path) -> Any:
    # 2 ms a token, 4 tokens a request, one request at a time: the gateway queues.
    process = fake_upstream(tmp_path, "u", token_interval=0.002)
    yield process
    process.stop()


def test_a_higher_band_goes_before_any_waiting_lower_band_request(tmp_path, upstream):
    results = {}
    for bands in (True, False):
        gw = gateway(
            tmp_path,
            [{"url": upstream.url, "models": ["fake"], "max_concurrent": 1}],
            name=f"gw-{bands}",
            tenants=str(banded_tenants(tmp_path, bands)),
        )
        try:
            asyncio.run(_load(gw.url, 4.0, {"interactive": 2, "batch-a": 6, "batch-b": 6}))
            rows = recent(gw)
            assert {r["band"] for r in rows if r["tenant"] != "interactive"} == {int(bands)}
            results[bands] = batch_dispatches_while_interactive_waited(rows)
        finally:
            gw.stop()
    banded, flat = results[True], results[False]
    assert len(banded) > 20
    # Strict: while an interactive request waits, no batch request is dispatched.
    assert max(banded) == 0
    # Without bands VTC shares the slot: interactive requests do wait behind batch ones
    # (the same check fails, so it can tell).
    assert max(flat) > 0


def test_tenants_inside_a_band_share_by_vtc(tmp_path, upstream):
    gw = gateway(
        tmp_path,
        [{"url": upstream.url, "models": ["fake"], "max_concurrent": 1}],
        tenants=str(banded_tenants(tmp_path, bands=True)),
    )
    try:
        asyncio.run(_load(gw.url, 4.0, {"batch-a": 6, "batch-b": 6}))
        rows = recent(gw)
    finally:
        gw.stop()
    # The steady part: both tenants waiting all along (their 6 streams each).
    steady = rows[20:-20]
    a = sum(r["tenant"] == "batch-a" for r in steady)
    b = sum(r["tenant"] == "batch-b" for r in steady)
    assert a + b > 100
    assert a / b == pytest.approx(2.0, rel=0.15)  # batch-a weighs 2


@pytest.mark.parametrize("order", ["priority", "arrival"])
def test_a_tenant_s_own_requests_go_in_priority_order(tmp_path, upstream, order):
    gw = gateway(
        tmp_path,
        [{"url": upstream.url, "models": ["fake"], "max_concurrent": 1}],
        tenants=str(banded_tenants(tmp_path, bands=True)),
        order_within_tenant=order,
    )

    async def run() -> None:
        # batch-b holds the one slot for 0.8 s (400 tokens at 2 ms); meanwhile batch-a
        # queues four requests of priority 5, then one of priority -1.
        busy = asyncio.ensure_future(_one(gw.url, "batch-b", 400))
        await asyncio.sleep(0.1)
        low = [asyncio.ensure_future(_one(gw.url, "batch-a", 4, 5)) for _ in range(4)]
        await asyncio.sleep(0.2)
        urgent = asyncio.ensure_future(_one(gw.url, "batch-a", 4, -1))
        await asyncio.gather(busy, *low, urgent)

    try:
        asyncio.run(run())
        rows = [r for r in recent(gw) if r["tenant"] == "batch-a"]
    finally:
        gw.stop()
    priorities = [r["priority"] for r in rows]
    assert sorted(priorities) == [-1, 5, 5, 5, 5]
    # Waiting behind batch-b's long request, the urgent one overtakes its tenant's own
    # (the default); in arrival order it goes last.
    assert priorities[0 if order == "priority" else -1] == -1


def test_groups_share_by_weight_through_the_gateway_and_redis(tmp_path, upstream, redis_server):
    """Org a (weight 2: interactive and batch-a) and org b (batch-b), one band."""
    tenants = {
        "admin_key_sha256": hash_key("admin"),
        "groups": {"org-a": {"weight": 2}, "org-b": {}},
        "tenants": [
            {"name": name, "key_sha256": hash_key(key), "group": group, "max_waiting": 1024}
            for (name, key), group in zip(KEYS.items(), ["org-a", "org-a", "org-b"], strict=True)
        ],
    }
    path = tmp_path / "grouped.yaml"
    path.write_text(yaml.safe_dump(tenants))
    gw = gateway(
        tmp_path,
        [{"url": upstream.url, "models": ["fake"], "max_concurrent": 1}],
        tenants=str(path),
        redis={"url": redis_server.url, "namespace": "groups"},
    )
    try:
        asyncio.run(_load(gw.url, 4.0, {"interactive": 4, "batch-a": 4, "batch-b": 8}))
        admin = {"Authorization": "Bearer admin"}
        rows = recent(gw, admin)[20:-20]
        state = httpx.get(gw.url + "/v1/gateway/state", headers=admin, timeout=5).json()
        metrics = httpx.get(gw.metrics_url + "/metrics", timeout=5).text
        # Replicas sharing Redis take weights from the tenants file only: the admin API
        # refuses a change that would reach this replica alone, pointing to the file.
        changed = httpx.post(
            gw.url + "/admin/groups/org-b/weight", json={"weight": 3}, headers=admin, timeout=5
        )
        unknown = httpx.post(
            gw.url + "/admin/groups/org-z/weight", json={"weight": 3}, headers=admin, timeout=5
        )
        tenant_key = {"Authorization": f"Bearer {KEYS['batch-b']}"}
        refused = httpx.post(
            gw.url + "/admin/tenants/batch-b/weight", json={"weight": 3}, headers=tenant_key
        )
    finally:
        gw.stop()
    org_a = sum(r["tenant"] != "batch-b" for r in rows)
    org_b = len(rows) - org_a
    assert org_a / org_b == pytest.approx(2.0, rel=0.15)
    # Inside org a, interactive and batch-a share evenly.
    inside = sum(r["tenant"] == "interactive" for r in rows) / org_a
    assert inside == pytest.approx(0.5, rel=0.15)
    assert set(state["group_counters"]) == {"org-a", "org-b"}
    assert 'tokenfair:group_vtc_counter{group="org-a"}' in metrics
    assert changed.status_code == unknown.status_code == 409
    assert changed.json()["error"]["code"] == "change_the_tenants_file"
    assert refused.status_code == 403
