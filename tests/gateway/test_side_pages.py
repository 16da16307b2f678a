"""The gateway's own pages in one process (no upstream is asked): /health says which
upstreams are in rotation to the operator only, the API docs are served only when the
config turns them on, and a tenants file reloaded is news at INFO, not a warning."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tokenfair.edge.tenants import hash_key
from tokenfair.gateway.app import Gateway, create_app
from tokenfair.gateway.config import parse_config

ADMIN, TENANT = "admin-key", "tenant-key"


def _config(tmp_path: Path, tenants: Any, **settings: Any) -> Any:
    config = {
        "tenants": tenants,
        "upstreams": [{"url": "http://127.0.0.1:9", "name": "gpu-0", "models": ["m"],
                       "max_concurrent": 1}],
        **settings,
    }  # fmt: skip
    return parse_config(yaml.safe_dump(config), str(tmp_path / "gateway.yaml"), tmp_path)


def _tenants(admin: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {"tenants": [{"name": "a", "key_sha256": [hash_key(TENANT)]}]}
    if admin:
        data["admin_key_sha256"] = hash_key(ADMIN)
    return data


def _get(app: Any, *requests: tuple[str, str | None]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return [
                await client.get(path, headers={"Authorization": f"Bearer {key}"} if key else {})
                for path, key in requests
            ]

    return asyncio.run(run())


def test_health_names_the_upstreams_to_the_admin_only(tmp_path: Path) -> None:
    app = create_app(_config(tmp_path, _tenants()))
    anyone, tenant, wrong, admin = _get(
        app, ("/health", None), ("/health", TENANT), ("/health", "nobody"), ("/health", ADMIN)
    )
    for answer in (anyone, tenant, wrong):  # a probe needs the status, nothing more
        assert (answer.status_code, answer.json()) == (200, {"status": "ok"})
    assert (admin.status_code, admin.json()) == (200, {"status": "ok", "upstreams": ["gpu-0"]})


def test_api_docs_only_when_the_config_turns_them_on(tmp_path: Path) -> None:
    pages = [("/openapi.json", None), ("/docs", None), ("/redoc", None)]
    off = _get(create_app(_config(tmp_path, _tenants())), *pages)
    assert [answer.status_code for answer in off] == [404, 404, 404]
    assert {answer.json()["error"]["code"] for answer in off} == {"not_found"}
    on = _get(create_app(_config(tmp_path, _tenants(), api_docs=True)), *pages)
    assert [answer.status_code for answer in on] == [200, 200, 200]
    assert "/v1/models" in on[0].json()["paths"]


def test_the_api_docs_state_what_the_gateway_answers(tmp_path: Path) -> None:
    # The completions (served by the proxy, not the app) are documented, with the errors
    # the gateway answers there; FastAPI's 422, which the gateway never sends, is not.
    (document,) = _get(
        create_app(_config(tmp_path, _tenants(), api_docs=True)), ("/openapi.json", None)
    )
    schema = document.json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        post = schema["paths"][path]["post"]
        body = post["requestBody"]["content"]["application/json"]["schema"]
        assert "model" in body["required"] and body["additionalProperties"] is True
        assert {"200", "400", "401", "404", "413", "429", "502", "503"} <= set(post["responses"])
    assert '"422"' not in document.text and "HTTPValidationError" not in document.text
    admin = schema["paths"]["/admin/tenants/{name}/weight"]["post"]["responses"]
    assert "400" in admin and "422" not in admin


def test_a_reload_is_logged_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(_tenants()))

    async def reload() -> None:
        Gateway(_config(tmp_path, "tenants.yaml")).reload_tenants()

    with caplog.at_level(logging.INFO, logger="tokenfair.gateway"):
        asyncio.run(reload())
    (record,) = [r for r in caplog.records if "tenants file reloaded" in r.getMessage()]
    assert record.levelno == logging.INFO
