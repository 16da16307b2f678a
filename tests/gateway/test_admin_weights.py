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


def _app(tmp_path: Path) -> Any:
    config = {
        "tenants": {
            "admin_key_sha256": hash_key(ADMIN),
            "groups": {"org": {}},
            "tenants": [{"name": "a", "key_sha256": [hash_key("tenant-key")], "group": "org"}],
        },
        "upstreams": [{"url": "http://127.0.0.1:9", "models": ["m"], "max_concurrent": 1}],
    }
    return create_app(parse_config(yaml.safe_dump(config), str(tmp_path / "gw.yaml"), tmp_path))


def _post(app: Any, path: str, body: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post(path, json=body, headers={"Authorization": f"Bearer {ADMIN}"})

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
