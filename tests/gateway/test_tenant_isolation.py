"""Tenants kept apart in a `tokenfair serve` upstream's prefix cache, through the gateway.

The gateway sends every request with its own key; the server's tenants file marks that
key's tenant `acts_for_tenants`, and the gateway (`engine: tokenfair`) names each
request's tenant in `x-tokenfair-tenant`. The upstream then caches per tenant, unless
the gateway's tenants file shares the prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.processes import KEYS, Process, gateway, sim_upstream
from tokenfair.edge.tenants import hash_key

pytestmark = pytest.mark.slow

GATEWAY_KEY, DIRECT_KEY, ADMIN_KEY = "key-of-the-gateway", "key-direct", "key-admin"
PLAIN_KEY = "key-plain"  # an ordinary tenant's key: a gateway left at its defaults
# About 1,500 sim tokens (4 bytes each): many full KV blocks.
DOCUMENT = "Clause {i}: the tenant's confidential terms, numbered and dated. " * 90


def _server_tenants(tmp: Path) -> Path:
    path = tmp / "server-tenants.yaml"
    data = {
        "admin_key_sha256": hash_key(ADMIN_KEY),
        "tenants": [
            {"name": "gateway", "key_sha256": [hash_key(GATEWAY_KEY)], "acts_for_tenants": True},
            {"name": "direct", "key_sha256": [hash_key(DIRECT_KEY)]},
            {"name": "plain", "key_sha256": [hash_key(PLAIN_KEY)]},
        ],
    }
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Process]]:
    tmp = tmp_path_factory.mktemp("isolation")
    server = sim_upstream(
        tmp,
        "server",
        "--enable-prefix-caching",
        "--block-size",
        "16",
        "--tenants",
        str(_server_tenants(tmp)),
        profile="zero",
    )
    upstream = {
        "url": server.url + "/v1",
        "models": ["sim"],
        "max_concurrent": 8,
        "engine": "tokenfair",
        "api_key": GATEWAY_KEY,
        "health_path": "/health",
    }
    # The defaults: no `engine`, an ordinary key (nothing marked on the server).
    plain_upstream = {k: v for k, v in upstream.items() if k != "engine"}
    plain_upstream["api_key"] = PLAIN_KEY
    apart = shared = default = None
    try:
        apart = gateway(tmp, [upstream], name="apart")
        default = gateway(tmp, [plain_upstream], name="default")
        shared_tenants = {
            "share_prefix_cache": True,
            "tenants": [{"name": n, "key_sha256": [hash_key(k)]} for n, k in KEYS.items()],
        }
        shared = gateway(tmp, [upstream], name="shared", tenants=shared_tenants)
        yield {"server": server, "apart": apart, "shared": shared, "default": default}
    finally:
        for process in (apart, shared, default):
            if process is not None:
                process.stop()
        server.stop()


def _cached(front: Process, tenant: str, prompt: str) -> int:
    """Send `prompt` as `tenant` through `front`; the prompt tokens the upstream served
    from its prefix cache, as its usage reports them."""
    answer = httpx.post(
        front.url + "/v1/completions",
        json={"model": "sim", "prompt": prompt, "max_tokens": 2},
        headers={"authorization": f"Bearer {KEYS[tenant]}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] > 1400
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))


def _generated(server: Process, tenant: str) -> float:
    text = httpx.get(
        server.url + "/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=5
    ).text
    line = f'tokenfair:generation_tokens_total{{tenant="{tenant}"}} '
    return sum(float(row.split()[-1]) for row in text.splitlines() if row.startswith(line))


def test_another_tenants_identical_prompt_is_never_a_hit(setup: dict[str, Process]) -> None:
    front, server = setup["apart"], setup["server"]
    prompt = DOCUMENT.format(i="apart")
    before = {t: _generated(server, t) for t in ("light", "heavy", "gateway")}
    assert _cached(front, "light", prompt) == 0
    assert _cached(front, "light", prompt) > 1000  # its own prompt: cached, so this can fail
    assert _cached(front, "heavy", prompt) == 0  # the very same prompt, another tenant
    # The server knew each request's tenant (its fairness and metrics), not the gateway's.
    assert _generated(server, "light") - before["light"] == 4
    assert _generated(server, "heavy") - before["heavy"] == 2
    assert _generated(server, "gateway") == before["gateway"]


def test_with_the_default_settings_tenants_are_kept_apart_too(
    setup: dict[str, Process],
) -> None:
    """No `engine` set and an ordinary key: the default (`vllm`) sends a salt per tenant,
    which the server takes within the key's tenant."""
    front = setup["default"]
    prompt = DOCUMENT.format(i="default")
    assert _cached(front, "light", prompt) == 0
    assert _cached(front, "light", prompt) > 1000
    assert _cached(front, "heavy", prompt) == 0


def test_a_tenants_file_that_shares_the_cache_shares_it(setup: dict[str, Process]) -> None:
    front = setup["shared"]
    prompt = DOCUMENT.format(i="shared")
    assert _cached(front, "light", prompt) == 0
    assert _cached(front, "heavy", prompt) > 1000


def _direct(server: Process, key: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/completions",
        json={"model": "sim", "prompt": "hello", "max_tokens": 3},
        headers={"authorization": f"Bearer {key}", **(headers or {})},
        timeout=30,
    )


def test_the_server_takes_the_tenant_header_from_the_gateways_key_only(
    setup: dict[str, Process],
) -> None:
    server = setup["server"]
    before = _generated(server, "team x")
    answer = _direct(server, GATEWAY_KEY, {"x-tokenfair-tenant": "team%20x"})
    assert answer.status_code == 200, answer.text
    assert _generated(server, "team x") - before == 3
    own = _generated(server, "gateway")
    assert _direct(server, GATEWAY_KEY).status_code == 200  # no header: the proxy itself
    assert _generated(server, "gateway") - own == 3
    refused = _direct(server, DIRECT_KEY, {"x-tokenfair-tenant": "team x"})
    assert refused.status_code == 403
    error: dict[str, Any] = refused.json()["error"]
    assert error["code"] == "tenant_header_not_allowed"
    assert "x-tokenfair-tenant" in error["message"] and "'direct'" in error["message"]
    assert _generated(server, "team x") - before == 3  # nothing ran for it


def test_a_gateway_client_cannot_send_the_tenant_header(setup: dict[str, Process]) -> None:
    answer = httpx.post(
        setup["apart"].url + "/v1/completions",
        json={"model": "sim", "prompt": "hello", "max_tokens": 2},
        headers={"authorization": f"Bearer {KEYS['light']}", "x-tokenfair-tenant": "heavy"},
        timeout=30,
    )
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "tenant_header_not_allowed"
