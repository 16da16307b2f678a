"""A key acts only as its tenant; the admin API is the admin's; prefix caches stay apart."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
import yaml

from tests.server.conftest import (
    ADMIN_KEY,
    KEYS,
    Server,
    engine_processes,
    launch,
    tenants_data,
)
from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.request import Request
from tokenfair.edge.tenants import hash_key

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def generated(server: Server, tenant: str) -> float:
    return server.metric("tokenfair:generation_tokens_total", tenant=tenant)


def test_no_spoofing_by_header_field_or_body(sim_server):
    before_a, before_b = generated(sim_server, "team-a"), generated(sim_server, "team-b")
    r = httpx.post(
        f"{sim_server.url}/v1/completions",
        json={
            "model": "sim:fixed:0.002",
            "prompt": "x",
            "max_tokens": 3,
            "user": "team-b",
            "tenant": "team-b",
            "client": "team-b",
        },
        headers={**sim_server.headers("team-a"), "x-tenant": "team-b"},
        timeout=30,
    )
    assert r.status_code == 200
    assert generated(sim_server, "team-a") - before_a == 3
    assert generated(sim_server, "team-b") == before_b
    # The header a trusted proxy names its tenants with: refused from a tenant's key.
    refused = httpx.post(
        f"{sim_server.url}/v1/completions",
        json={"model": "sim:fixed:0.002", "prompt": "x", "max_tokens": 3},
        headers={**sim_server.headers("team-a"), "x-tokenfair-tenant": "team-b"},
        timeout=30,
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "tenant_header_not_allowed"
    assert generated(sim_server, "team-a") - before_a == 3
    assert generated(sim_server, "team-b") == before_b
    # No key at all, whatever the headers say: 401.
    anonymous = httpx.post(
        f"{sim_server.url}/v1/completions",
        json={"model": "sim:fixed:0.002", "prompt": "x"},
        headers={"x-tokenfair-tenant": "team-b"},
    )
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_api_key"


def test_admin_api_refuses_tenant_keys(sim_server):
    for path in ("/admin/tenants",):
        assert httpx.get(f"{sim_server.url}{path}").status_code == 401
        for tenant in KEYS:
            assert (
                httpx.get(f"{sim_server.url}{path}", headers=sim_server.headers(tenant)).status_code
                == 403
            )
    weight = httpx.post(
        f"{sim_server.url}/admin/tenants/team-b/weight",
        json={"weight": 5},
        headers=sim_server.headers("team-b"),
    )
    assert weight.status_code == 403


def test_admin_lists_tenants_and_changes_weights(any_sim_server):
    httpx.post(
        f"{any_sim_server.url}/v1/completions",
        json={"model": "sim:fixed:0.002", "prompt": "x", "max_tokens": 2},
        headers=any_sim_server.headers("team-b"),
        timeout=30,
    )
    rows = {
        row["name"]: row
        for row in httpx.get(f"{any_sim_server.url}/admin/tenants", headers=ADMIN).json()["data"]
    }
    assert set(rows) >= {"team-a", "team-b", "team-c", "slow"}
    assert rows["team-b"]["weight"] == 2.0
    assert rows["team-b"]["service"] > 0
    assert rows["team-b"]["counter"] > 0
    assert {"waiting", "running", "preemptions"} <= set(rows["team-b"])
    changed = httpx.post(
        f"{any_sim_server.url}/admin/tenants/team-b/weight", json={"weight": 3.5}, headers=ADMIN
    )
    assert changed.status_code == 200
    rows = {
        row["name"]: row
        for row in httpx.get(f"{any_sim_server.url}/admin/tenants", headers=ADMIN).json()["data"]
    }
    assert rows["team-b"]["weight"] == 3.5
    assert any_sim_server.metric("tokenfair:tenant_weight", tenant="team-b") == 3.5
    bad = httpx.post(
        f"{any_sim_server.url}/admin/tenants/team-b/weight", json={"weight": -1}, headers=ADMIN
    )
    assert bad.status_code == 400
    unknown = httpx.post(
        f"{any_sim_server.url}/admin/tenants/nobody/weight", json={"weight": 1}, headers=ADMIN
    )
    assert unknown.status_code == 404
    httpx.post(
        f"{any_sim_server.url}/admin/tenants/team-b/weight", json={"weight": 2.0}, headers=ADMIN
    )
    recent = httpx.get(
        f"{any_sim_server.url}/admin/requests/recent",
        params={"tenant": "team-b", "limit": 1},
        headers=ADMIN,
    )
    (row,) = recent.json()["data"]
    assert row["tenant"] == "team-b" and row["completion_tokens"] == 2
    assert row["ttft_steps"] >= 1 and 0 < row["ttft_s"] <= row["e2e_s"]
    assert (
        httpx.get(
            f"{any_sim_server.url}/admin/requests/recent", headers=any_sim_server.headers()
        ).status_code
        == 403
    )


def test_trusted_header_only_when_configured(server_dir):
    server = launch(
        server_dir,
        "--model",
        "sim:zero",
        tenants={**tenants_data(), "trusted_tenant_header": "x-tokenfair-tenant"},
    )
    try:
        r = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "sim:zero", "prompt": "x", "max_tokens": 2},
            headers={"x-tokenfair-tenant": "team-b"},
        )
        assert r.status_code == 200
        assert server.metric("tokenfair:generation_tokens_total", tenant="team-b") == 2
    finally:
        server.stop()


@pytest.mark.model
def test_no_cross_tenant_prefix_hit(tiny_server):
    prompt = "A shared system prompt that is long enough to fill several KV blocks. " * 2

    def hits() -> float:
        return tiny_server.metric("tokenfair:prefix_cache_hits_total")

    def send(tenant: str) -> None:
        r = httpx.post(
            f"{tiny_server.url}/v1/completions",
            json={"model": "builtin:tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0},
            headers=tiny_server.headers(tenant),
            timeout=60,
        )
        assert r.status_code == 200

    send("team-a")
    first = hits()
    send("team-a")
    own = hits() - first
    assert own >= 16 * 4  # the tenant's own prefix is reused
    send("team-b")
    assert hits() - first == own  # nothing for another tenant


def test_salted_prefix_hashes():
    def request(rid: str, salt: str | None) -> Request:
        ids = list(range(40))
        return Request(rid, "c", len(ids), 0.0, prompt_token_ids=ids, cache_salt=salt)

    kv = KVCacheManager(num_blocks=16, block_size=8, enable_prefix_caching=True)
    first = request("r0", "a")
    assert kv.allocate(first, 40, kv.lookup_prefix(first)) is not None
    first.num_computed_tokens = 40
    kv.cache_full_blocks(first)
    kv.free(first)
    assert kv.lookup_prefix(request("r1", "b")).num_tokens == 0
    assert kv.lookup_prefix(request("r2", None)).num_tokens == 0
    # 4 full blocks, the last token recomputed
    assert kv.lookup_prefix(request("r3", "a")).num_tokens == 32
    kv.check_invariants()


def test_what_the_prefix_cache_is_keyed_by():
    from tokenfair.edge.tenants import Tenant
    from tokenfair.server.generation import cache_salt

    a, b, gateway = Tenant(name="a"), Tenant(name="b"), Tenant(name="gw", acts_for_tenants=True)
    # A tenant's own requests: its name; a request's cache_salt divides it further.
    assert cache_salt(a, None, None, shared=False) == "a"
    keys = {cache_salt(t, None, s, shared=False) for t in (a, b) for s in (None, "x", "y")}
    assert len(keys) == 6
    assert cache_salt(a, None, None, shared=True) is None  # share_prefix_cache
    assert cache_salt(a, None, "x", shared=True) == cache_salt(b, None, "x", shared=True)
    # A proxy's requests: apart per tenant unless the proxy's salt says otherwise, and
    # never in the space of the server's own tenants, whatever the server shares.
    for shared in (False, True):
        proxied = {cache_salt(t, gateway, None, shared) for t in (a, b)}
        assert len(proxied) == 2 and not proxied & {"a", "b", None}
        assert cache_salt(a, gateway, "s", shared) == cache_salt(b, gateway, "s", shared)
        assert cache_salt(a, gateway, "s", shared) != cache_salt(a, None, "s", shared)


@pytest.mark.parametrize("engine", ["thread", "process"])
def test_sighup_reloads_and_keeps_the_old_file_on_error(server_dir, engine):
    data = tenants_data()
    server = launch(server_dir, "--model", "sim:fixed:0.002", "--engine", engine, tenants=data)
    path = next(server_dir.glob(f"tenants-{server.url.rsplit(':', 1)[1]}.yaml"))
    try:
        # A terminal's hangup reaches the whole process group: the engine must live on.
        for child in engine_processes(server):
            os.kill(child, signal.SIGHUP)
        url = f"{server.url}/v1/completions"
        body = {"model": "sim:fixed:0.002", "prompt": "x", "max_tokens": 300, "stream": True}
        with httpx.stream(
            "POST", url, json=body, headers=server.headers("team-a"), timeout=30
        ) as in_flight:
            data["tenants"].append({"name": "team-d", "key_sha256": [hash_key("key-d")]})  # type: ignore[attr-defined]
            path.write_text(yaml.safe_dump(data))
            server.process.send_signal(signal.SIGHUP)
            new_key = {"Authorization": "Bearer key-d"}
            for _ in range(100):
                if (
                    httpx.post(
                        url, json={**body, "max_tokens": 1, "stream": False}, headers=new_key
                    ).status_code
                    == 200
                ):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the reloaded key never worked")
            events = [line for line in in_flight.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in events[-2]  # the in-flight request was not dropped
        path.write_text("tenants:\n  - name: broken\n    weight: -3\n")
        server.process.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        ok = httpx.post(url, json={**body, "max_tokens": 1, "stream": False}, headers=new_key)
        assert ok.status_code == 200  # the previous file stays in force
        assert "tenants.0.weight" in server.log.read_text()
    finally:
        server.stop()


def test_admin_reaches_a_tenant_whose_name_has_a_slash(server_dir):
    data = tenants_data()
    data["tenants"].append({"name": "org/team", "key_sha256": [hash_key("key-org")]})  # type: ignore[attr-defined]
    server = launch(server_dir, "--model", "sim:zero", tenants=data)
    try:
        for path, weight in (("org/team", 3.0), ("org%2Fteam", 4.0)):
            changed = httpx.post(
                f"{server.url}/admin/tenants/{path}/weight", json={"weight": weight}, headers=ADMIN
            )
            assert changed.status_code == 200, changed.text
            assert changed.json() == {"name": "org/team", "weight": weight}
        assert server.metric("tokenfair:tenant_weight", tenant="org/team") == 4.0
        # strict: a number, not something that converts to one; and in the weights'
        # range (core/weights.py): 1e-320 would make every counter infinite
        for weight in ("3", True, 1e-320, 0.001, 1000.0):
            refused = httpx.post(
                f"{server.url}/admin/tenants/org/team/weight",
                json={"weight": weight},
                headers=ADMIN,
            )
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "weight"
    finally:
        server.stop()
