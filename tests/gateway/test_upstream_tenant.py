"""What tells each upstream engine the request's tenant: the body's `cache_salt` and
`vllm_xargs.tenant`, or the `x-tokenfair-tenant` header; and the salts themselves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.processes import KEYS, fake_upstream, gateway, stats
from tokenfair.edge.errors import APIError
from tokenfair.gateway.config import parse_config
from tokenfair.gateway.transport.requests import parse_call
from tokenfair.gateway.transport.upstream_tenant import CacheSalts, for_upstream, salt_key

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _call(body: dict[str, object], kind: str = "completions"):  # type: ignore[no-untyped-def]
    return parse_call(json.dumps({"model": "m", "prompt": "x", **body}).encode(), kind)


def test_salts_are_per_tenant_keyed_and_never_the_name() -> None:
    one, two = CacheSalts("namespace-a"), CacheSalts("namespace-a")
    assert one.salt("team-a") == two.salt("team-a")  # the same in every replica
    assert one.salt("team-a") != one.salt("team-b")
    assert CacheSalts("namespace-b").salt("team-a") != one.salt("team-a")  # keyed
    for salt in (one.salt("team-a"), one.salt("team-a", "x"), one.salt(None)):
        assert HEX64.match(salt)  # vLLM: at most 128 characters, no '@', '/', '\\'
    assert "team-a" not in one.salt("team-a")
    # A client's own salt divides its tenant's cache; it never reaches another tenant's.
    assert one.salt("team-a", "user-1") not in {one.salt("team-a"), one.salt("team-b")}
    assert one.salt("team-a", "user-1") != one.salt("team-b", "user-1")
    assert one.salt("a", "b") != one.salt("a\0b") != one.salt(None, "a")
    assert salt_key(None, None) == salt_key(None, "tokenfair") == "tokenfair"
    assert salt_key("a-long-shared-secret", "tokenfair") == "a-long-shared-secret"


def test_the_default_engine_gets_the_body_as_sent() -> None:
    call = _call({"cache_salt": "mine", "vllm_xargs": {"k": 1}})
    salts = CacheSalts("k")
    assert for_upstream(call, "team-a", "openai", salts, shared=False) == (call.body, None)


def test_vllm_gets_a_salt_and_the_tenant() -> None:
    salts = CacheSalts("k")
    raw = b'{"model": "m", "prompt": "x", "seed": 123456789012345678901234567890, "stream": true}'
    call = parse_call(raw, "completions")
    body, headers = for_upstream(call, "team-a", "vllm", salts, shared=False)
    sent = json.loads(body)
    assert headers is None
    assert sent["cache_salt"] == salts.salt("team-a")
    assert sent["vllm_xargs"] == {"tenant": "team-a"}
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["seed"] == 123456789012345678901234567890  # every other value as sent
    # The client's own fields: its salt hashed in with its tenant, its other arguments
    # kept, and never its word for the tenant.
    call = _call({"cache_salt": "user-1", "vllm_xargs": {"tenant": "team-b", "k": 2}})
    sent = json.loads(for_upstream(call, "team-a", "vllm", salts, shared=False)[0])
    assert sent["cache_salt"] == salts.salt("team-a", "user-1")
    assert sent["vllm_xargs"] == {"tenant": "team-a", "k": 2}
    # Shared by the tenants file: no salt of the gateway's, the tenant still named.
    call = _call({"cache_salt": "user-1"})
    sent = json.loads(for_upstream(call, "team-a", "vllm", salts, shared=True)[0])
    assert sent["cache_salt"] == "user-1" and sent["vllm_xargs"] == {"tenant": "team-a"}


def test_sglang_gets_a_salt_only() -> None:
    salts = CacheSalts("k")
    sent = json.loads(for_upstream(_call({}), "team-a", "sglang", salts, shared=False)[0])
    assert sent["cache_salt"] == salts.salt("team-a") and "vllm_xargs" not in sent
    call = _call({})
    assert for_upstream(call, "team-a", "sglang", salts, shared=True)[0] == call.body


def test_a_tokenfair_server_gets_the_header() -> None:
    salts = CacheSalts("k")
    call = _call({})
    body, headers = for_upstream(call, "org/team a", "tokenfair", salts, shared=False)
    assert body == call.body  # the header alone keeps the tenant apart there
    assert headers == {"x-tokenfair-tenant": "org%2Fteam%20a"}
    call = _call({"cache_salt": "user-1"})
    body, _ = for_upstream(call, "team-a", "tokenfair", salts, shared=False)
    assert json.loads(body)["cache_salt"] == salts.salt("team-a", "user-1")
    # Shared: one salt for every tenant, which replaces the server's per-tenant default.
    body, _ = for_upstream(_call({}), "team-a", "tokenfair", salts, shared=True)
    assert json.loads(body)["cache_salt"] == salts.salt(None)


def test_the_client_fields_the_gateway_rewrites_must_have_their_types() -> None:
    for body, param in (({"cache_salt": 3}, "cache_salt"), ({"vllm_xargs": [1]}, "vllm_xargs")):
        with pytest.raises(APIError) as raised:
            _call(body)
        assert raised.value.status_code == 400
        assert raised.value.body()["error"]["param"] == param


def test_an_unknown_engine_names_the_key() -> None:
    text = (
        "upstreams:\n  - url: http://x\n    models: [m]\n    max_concurrent: 1\n    engine: tgi\n"
    )
    with pytest.raises(ValueError) as raised:
        parse_config(text)
    assert str(raised.value).startswith("<config>:5: upstreams.0.engine: Input should be")
    assert parse_config(text.replace("tgi", "vllm")).upstreams[0].engine == "vllm"
    assert parse_config(text.replace("    engine: tgi\n", "")).upstreams[0].engine == "vllm"
    short = "cache_salt_secret: short\n" + text.replace("tgi", "vllm")
    with pytest.raises(ValueError, match="<config>:1: cache_salt_secret"):
        parse_config(short)


@pytest.mark.slow
def test_two_gateways_send_a_vllm_upstream_the_same_salt_per_tenant(tmp_path: Path) -> None:
    upstream = fake_upstream(tmp_path, "vllm")
    config = {"url": upstream.url + "/v1", "models": ["m"], "max_concurrent": 4, "engine": "vllm"}
    secret = "shared-by-every-replica-0123456789"
    fronts = []
    try:
        for name in ("gw-1", "gw-2"):
            fronts.append(gateway(tmp_path, [config], name=name, cache_salt_secret=secret))
        seen: dict[tuple[str, str], dict[str, object]] = {}
        for front in fronts:
            for tenant in ("light", "heavy"):
                client = openai.OpenAI(
                    base_url=front.url + "/v1", api_key=KEYS[tenant], max_retries=0
                )
                client.completions.create(model="m", prompt="the same prompt", max_tokens=2)
                seen[(front.log.stem, tenant)] = stats(upstream)["last_body"]
        for body in seen.values():
            assert HEX64.match(str(body["cache_salt"]))
            assert body["prompt"] == "the same prompt" and body["max_tokens"] == 2
        for tenant in ("light", "heavy"):
            assert seen[("gw-1", tenant)]["vllm_xargs"] == {"tenant": tenant}
            assert seen[("gw-1", tenant)]["cache_salt"] == seen[("gw-2", tenant)]["cache_salt"]
        assert seen[("gw-1", "light")]["cache_salt"] != seen[("gw-1", "heavy")]["cache_salt"]
        # A stream: the salt beside the usage the gateway asks for.
        with httpx.stream(
            "POST",
            fronts[0].url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            headers={"authorization": f"Bearer {KEYS['light']}"},
            timeout=30,
        ) as response:
            assert response.status_code == 200
            response.read()
        body = stats(upstream)["last_body"]
        assert body["cache_salt"] == seen[("gw-1", "light")]["cache_salt"]
        assert body["stream_options"] == {"include_usage": True}
        assert stats(upstream)["last_tenant_header"] is None  # vLLM is told in the body
    finally:
        for front in fronts:
            front.stop()
        upstream.stop()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tokenfair"])
@pytest.mark.parametrize("shared", [False, True])
def test_the_gateway_divides_upstream_caches_as_the_server_divides_its_own(
    engine: str, shared: bool
) -> None:
    # Two requests meet the same part of an upstream's cache exactly when a tokenfair
    # server given the same tenants and salts would key them alike.
    from tokenfair.edge.tenants import Tenant
    from tokenfair.server.generation import cache_salt

    salts = CacheSalts("k")
    requests = [(t, s) for t in ("a", "b") for s in (None, "x", "y")]

    def upstream_part(tenant: str, salt: str | None) -> tuple:
        call = _call({} if salt is None else {"cache_salt": salt})
        body, headers = for_upstream(call, tenant, engine, salts, shared)
        sent = json.loads(body).get("cache_salt")
        # A tokenfair upstream keys a request by its header's tenant unless it is
        # sent a salt; vLLM and SGLang key by the salt alone.
        return (headers or {}, sent) if sent is None else (None, sent)

    server = {r: cache_salt(Tenant(name=r[0]), None, r[1], shared) for r in requests}
    gateway = {r: upstream_part(*r) for r in requests}
    for one in requests:
        for other in requests:
            assert (server[one] == server[other]) == (gateway[one] == gateway[other]), (
                one,
                other,
            )
