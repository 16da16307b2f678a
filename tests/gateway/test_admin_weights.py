"""The gateway's admin API takes a weight only in the weights' range (core/weights.py),
as a number: `{"weight": 1e-320}` would make the counters infinite, `true` is not 1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tokenfair.edge.tenants import hash_key
from tokenfair.gateway.app import create_app
from tokenfair.gateway.config import parse_config

ADMIN = "admin-key"


def _app(tmp_path: Path, **settings: Any) -> Any:
    config = {
        "tenants": {
            "admin_key_sha256": hash_key(ADMIN),
            "groups": {"org": {}},
            "tenants": [{"name": "a", "key_sha256": [hash_key("tenant-key")], "group": "org"}],
        },
        "upstreams": [{"url": "http://127.0.0.1:9", "models": ["m"], "max_concurrent": 1}],
        **settings,
    }
    return create_app(parse_config(yaml.safe_dump(config), str(tmp_path / "gw.yaml"), tmp_path))


def _post(app: Any, path: str, body: Any, key: str | None = ADMIN, **kwargs: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            if body is None:
                return await client.post(path, headers=headers, **kwargs)
            return await client.post(path, json=body, headers=headers)

    return asyncio.run(run())


@pytest.mark.parametrize("path", ["/admin/tenants/a/weight", "/admin/groups/org/weight"])
def test_a_weight_outside_the_range_or_not_a_number_is_refused(tmp_path: Path, path: str) -> None:
    app = _app(tmp_path)
    for weight in (1e-320, 1e-300, 0.001, 1000.0, 1e300, 0, -1, True, "3"):
        refused = _post(app, path, {"weight": weight})
        assert refused.status_code == 400, (weight, refused.text)
        error = refused.json()["error"]
        assert error["param"] == "weight"
        assert "\n" not in error["message"]
    for weight in (0.01, 2, 100.0):
        changed = _post(app, path, {"weight": weight})
        assert changed.status_code == 200, changed.text
        assert changed.json()["weight"] == weight


@pytest.mark.parametrize("path", ["/admin/tenants/a/weight", "/admin/groups/org/weight"])
def test_the_key_is_checked_before_the_body(tmp_path: Path, path: str) -> None:
    # As the server: no key or a tenant's is refused whatever the body, even one that
    # is not JSON (a 400 for the body would tell anyone the path exists and parses).
    app = _app(tmp_path)
    for key, status in ((None, 401), ("tenant-key", 403)):
        for body in ({"weight": 2}, None):
            kwargs = {} if body is not None else {"content": b"not json"}
            refused = _post(app, path, body, key=key, **kwargs)
            assert refused.status_code == status, (key, body, refused.text)


@pytest.mark.parametrize("path", ["/admin/tenants/a/weight", "/admin/groups/org/weight"])
def test_replicas_sharing_redis_refuse_a_change_one_replica_cannot_share(
    tmp_path: Path, path: str
) -> None:
    app = _app(tmp_path, redis={"url": "redis://127.0.0.1:9/0"})  # never reached here
    refused = _post(app, path, {"weight": 2})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "change_the_tenants_file" and "tenants file" in error["message"]
