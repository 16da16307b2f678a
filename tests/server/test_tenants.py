"""Tenants file validation, authentication, admin keys, and the request models."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from tokenfair.cli import app
from tokenfair.edge.directory import TenantDirectory, bearer_key
from tokenfair.edge.errors import APIError, validation_message
from tokenfair.edge.tenants import (
    OPEN_TENANT,
    TenantsFileError,
    hash_key,
    load_tenants,
    parse_tenants,
)
from tokenfair.server.protocol import ChatCompletionRequest, CompletionRequest

KEY_A, KEY_B, ADMIN = "key-a", "key-b", "admin-secret"


def tenants_yaml(**extra: object) -> dict[str, object]:
    data: dict[str, object] = {
        "admin_key_sha256": hash_key(ADMIN),
        "tenants": [
            {"name": "team-a", "key_sha256": [hash_key(KEY_A)], "weight": 2.0, "priority": 1},
            {"name": "team-b", "key_sha256": hash_key(KEY_B), "max_waiting": 3, "rpm": 60},
        ],
    }
    data.update(extra)
    return data


@pytest.fixture
def directory() -> TenantDirectory:
    return TenantDirectory(parse_tenants(tenants_yaml()))


def write(tmp_path, text: str):
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return path


def test_hash_key_is_sha256_hex():
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    with pytest.raises(ValueError):
        hash_key("")


def test_load_reads_defaults_and_lowercases_hashes(tmp_path):
    upper = hash_key(KEY_A).upper()
    path = write(tmp_path, f"tenants:\n  - name: t\n    key_sha256: ['{upper}']\n")
    loaded = load_tenants(path)
    tenant = loaded.tenants[0]
    assert tenant.key_sha256 == [hash_key(KEY_A)]
    assert (tenant.weight, tenant.priority, tenant.max_waiting) == (1.0, 0, 256)
    assert (tenant.max_tokens_per_request, tenant.timeout_s, tenant.rpm) == (8192, None, None)
    assert loaded.trusted_tenant_header is None
    assert loaded.share_prefix_cache is False
    assert loaded.admin_key_sha256 is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("tenants:\n  - name: t\n    weight: 0\n", "tenants.0.weight"),
        ("tenants:\n  - name: t\n    colour: red\n", "tenants.0.colour: unknown key"),
        ("tenants:\n  - name: t\n    key_sha256: [abc]\n", "tenants.0.key_sha256.0"),
        ("tenants:\n  - weight: 1\n", "tenants.0.name: required key missing"),
        ("tenants:\n  - name: t\n  - name: t\n", "duplicate tenant name"),
        ("admin_key_sha256: nothex\n", "admin_key_sha256"),
        ("tenants: [\n", "tenants.yaml:2: not valid YAML"),
        # Every mistake refused at its line: no weight out of range, no boolean for a
        # number, no key given twice (YAML would keep the last one silently).
        (
            "tenants:\n  - name: t\n    weight: 1.0e-300\n",
            "tenants.yaml:3: tenants.0.weight: must be",
        ),
        ("tenants:\n  - name: t\n    weight: 1000\n", "a number from 0.01 to 100"),
        ("tenants:\n  - name: t\n    weight: true\n", "tenants.0.weight: must be a number"),
        ("tenants:\n  - name: t\n    max_waiting: true\n", "expected a number, got the boolean"),
        (
            "tenants:\n  - name: t\n    weight: 1\n    weight: 5\n",
            "tenants.yaml:4: the key 'weight' is given twice in one mapping (first at line 3)",
        ),
        (
            "tenants:\n  - name: t\ntenants:\n  - name: u\n",
            "tenants.yaml:3: the key 'tenants' is given twice",
        ),
        ("- a\n- b\n", "expected a mapping"),
        ("tenants:\n  - name: t\n    max_waiting: -1\n", "tenants.0.max_waiting"),
        ("", "the file is empty"),  # a half-written file must not lock everyone out
        ("# nothing yet\n", "the file is empty"),
        ("tenants: []\n", "tenants: no tenant"),
        ("admin_key_sha256: null\n", "tenants: required key missing"),
    ],
)
def test_bad_files_name_the_key(tmp_path, text, names):
    path = write(tmp_path, text)
    with pytest.raises(TenantsFileError) as caught:
        load_tenants(path)
    assert str(path) in str(caught.value)
    assert names in str(caught.value)


def test_bad_files_name_the_line(tmp_path):
    path = write(tmp_path, "tenants:\n  - name: a\n  - name: t\n    colour: red\n")
    with pytest.raises(TenantsFileError, match=r"tenants.yaml:4: tenants.1.colour: unknown key"):
        load_tenants(path)


def test_a_key_belongs_to_one_tenant():
    data = tenants_yaml()
    data["tenants"][1]["key_sha256"] = [hash_key(KEY_A)]  # type: ignore[index]
    with pytest.raises(TenantsFileError, match="already belongs to tenant 'team-a'"):
        parse_tenants(data)
    with pytest.raises(TenantsFileError, match="admin key cannot be a tenant key"):
        parse_tenants(tenants_yaml(admin_key_sha256=hash_key(KEY_A)))


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(TenantsFileError, match="cannot read"):
        load_tenants(tmp_path / "absent.yaml")


def test_bearer_key_names_the_tenant(directory):
    assert directory.authenticate(f"Bearer {KEY_A}", {}).name == "team-a"
    assert directory.authenticate(f"bearer  {KEY_B} ", {}).name == "team-b"
    assert directory.get("team-a").weight == 2.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "authorization", [None, "", "Bearer", "Basic a2V5LWE=", "Bearer nope", KEY_A]
)
def test_missing_or_unknown_key_is_401(directory, authorization):
    with pytest.raises(APIError) as caught:
        directory.authenticate(authorization, {})
    assert caught.value.status_code == 401
    assert caught.value.body()["error"]["code"] == "invalid_api_key"


def test_header_cannot_choose_the_tenant_unless_trusted(directory):
    # Off by default: an ordinary key's request naming another tenant is refused by name,
    # never honoured (nor silently ignored); without a key it is a 401 first.
    headers = {"x-tokenfair-tenant": "team-b"}
    with pytest.raises(APIError) as caught:
        directory.authenticate(f"Bearer {KEY_A}", headers)
    assert caught.value.status_code == 403
    error = caught.value.body()["error"]
    assert error["code"] == "tenant_header_not_allowed"
    assert "x-tokenfair-tenant" in error["message"] and "acts_for_tenants" in error["message"]
    with pytest.raises(APIError) as caught:
        directory.authenticate(None, headers)
    assert caught.value.status_code == 401
    # Other headers never name a tenant.
    assert directory.authenticate(f"Bearer {KEY_A}", {"x-tenant": "team-b"}).name == "team-a"


PROXY_KEY = "key-gateway"


def proxy_directory(**extra: object) -> TenantDirectory:
    data = tenants_yaml(**extra)
    data["tenants"].append(  # type: ignore[attr-defined]
        {
            "name": "gateway",
            "key_sha256": [hash_key(PROXY_KEY)],
            "acts_for_tenants": True,
            "weight": 4.0,
            "max_tokens_per_request": 32768,
        }
    )
    return TenantDirectory(parse_tenants(data))


def test_a_trusted_proxy_names_the_tenant_it_acts_for():
    directory = proxy_directory()
    proxy = f"Bearer {PROXY_KEY}"
    # Alone, the proxy is its own tenant.
    assert directory.identify(proxy, {}).tenant.name == "gateway"
    assert directory.identify(proxy, {}).proxy is None
    # A tenant of the file: that tenant, its own settings.
    caller = directory.identify(proxy, {"X-Tokenfair-Tenant": "team-a"})
    assert caller.tenant.name == "team-a" and caller.tenant.weight == 2.0
    assert caller.proxy is not None and caller.proxy.name == "gateway"
    # Any other: made from the proxy's entry, under its own name, kept for next time.
    other = directory.identify(proxy, {"x-tokenfair-tenant": "org%2Fteam%20x"}).tenant
    assert other.name == "org/team x"
    assert (other.weight, other.max_tokens_per_request) == (4.0, 32768)
    assert not other.acts_for_tenants and other.key_sha256 == []
    assert directory.identify(proxy, {"x-tokenfair-tenant": "org/team x"}).tenant is other
    assert directory.get("org/team x") is other
    assert directory.weights()["org/team x"] == 4.0
    for bad in ("", "  ", "x" * 257, "%ff", "a%00b", "a%0Ab"):
        with pytest.raises(APIError) as caught:
            directory.identify(proxy, {"x-tokenfair-tenant": bad})
        assert caught.value.status_code == 400
    # The file's ordinary tenants still may not send it.
    with pytest.raises(APIError) as caught:
        directory.identify(f"Bearer {KEY_B}", {"x-tokenfair-tenant": "team-a"})
    assert caught.value.status_code == 403


def test_the_acting_header_without_a_tenants_file_is_refused():
    open_dir = TenantDirectory.open()
    with pytest.raises(APIError) as caught:
        open_dir.authenticate(None, {"x-tokenfair-tenant": "team-a"})
    assert caught.value.status_code == 403
    assert "no tenants file" in caught.value.body()["error"]["message"]


def test_tenants_named_by_proxies_are_bounded(monkeypatch):
    import tokenfair.edge.directory as tenants

    monkeypatch.setattr(tenants, "MAX_ACTED_TENANTS", 2)
    directory = proxy_directory()
    proxy = f"Bearer {PROXY_KEY}"
    for name in ("u1", "u2", "team-a"):  # a tenant of the file never counts
        directory.identify(proxy, {"x-tokenfair-tenant": name})
    with pytest.raises(APIError) as caught:
        directory.identify(proxy, {"x-tokenfair-tenant": "u3"})
    assert caught.value.status_code == 429
    assert caught.value.body()["error"]["code"] == "too_many_tenants"


def test_trusted_header_behind_a_proxy():
    directory = TenantDirectory(
        parse_tenants(tenants_yaml(trusted_tenant_header="X-Tokenfair-Tenant"))
    )
    assert directory.authenticate(None, {"X-TOKENFAIR-TENANT": "team-b"}).name == "team-b"
    assert directory.authenticate(f"Bearer {KEY_A}", {}).name == "team-a"
    with pytest.raises(APIError) as caught:
        directory.authenticate(None, {"x-tokenfair-tenant": "nobody"})
    assert caught.value.status_code == 401


def test_user_field_never_changes_a_keyed_tenant(directory):
    tenant = directory.authenticate(f"Bearer {KEY_A}", {})
    assert directory.for_user(tenant, "team-b") is tenant


def test_open_directory():
    open_dir = TenantDirectory.open()
    tenant = open_dir.authenticate(None, {})
    assert tenant.name == OPEN_TENANT
    assert open_dir.for_user(tenant, "alice") is tenant
    assert not open_dir.admin_enabled


def test_tenant_from_user():
    open_dir = TenantDirectory.open(tenant_from_user=True)
    base = open_dir.authenticate("Bearer anything", {})
    alice = open_dir.for_user(base, "alice")
    assert alice.name == "alice"
    assert open_dir.for_user(base, "alice") is alice
    assert open_dir.for_user(base, None) is base
    assert {t.name for t in open_dir.tenants} == {OPEN_TENANT, "alice"}


def test_tenant_from_user_is_bounded(monkeypatch):
    import tokenfair.edge.directory as tenants

    monkeypatch.setattr(tenants, "MAX_USER_TENANTS", 3)
    open_dir = TenantDirectory.open(tenant_from_user=True)
    base = open_dir.authenticate(None, {})
    for user in ("u1", "u2", "u3"):
        open_dir.for_user(base, user)
    with pytest.raises(APIError) as caught:
        open_dir.for_user(base, "u4")
    assert caught.value.status_code == 429 and caught.value.code == "too_many_users"
    assert open_dir.for_user(base, "u2").name == "u2"  # those already known still are


def test_admin_key_checks(directory):
    directory.check_admin(f"Bearer {ADMIN}")
    for authorization, status in [(None, 401), ("Bearer wrong", 401), (f"Bearer {KEY_A}", 403)]:
        with pytest.raises(APIError) as caught:
            directory.check_admin(authorization)
        assert caught.value.status_code == status
    with pytest.raises(APIError) as caught:
        TenantDirectory.open().check_admin(f"Bearer {ADMIN}")
    assert caught.value.status_code == 404


def test_set_weight_and_replace(directory):
    assert directory.set_weight("team-b", 4.0).weight == 4.0
    assert directory.authenticate(f"Bearer {KEY_B}", {}).weight == 4.0
    with pytest.raises(KeyError):
        directory.set_weight("nobody", 1.0)
    with pytest.raises(ValueError):
        directory.set_weight("team-b", 0.0)
    smaller = tenants_yaml()
    smaller["tenants"] = smaller["tenants"][:1]  # type: ignore[index]
    directory.replace(parse_tenants(smaller))
    with pytest.raises(APIError):
        directory.authenticate(f"Bearer {KEY_B}", {})
    assert directory.get("team-a") is not None


@given(st.text(min_size=1, max_size=40).filter(lambda s: s.strip() == s and " " not in s))
def test_any_key_round_trips(key):
    directory = TenantDirectory(
        parse_tenants({"tenants": [{"name": "t", "key_sha256": [hash_key(key)]}]})
    )
    assert bearer_key(f"Bearer {key}") == key
    assert directory.authenticate(f"Bearer {key}", {}).name == "t"


# --- the request models ---
def test_completion_request_ignores_unknown_fields_and_lists_its_prompts():
    request = CompletionRequest.model_validate({"model": "m", "prompt": ["hi"], "frobnicate": 1})
    assert request.prompt_values() == ["hi"]
    assert CompletionRequest(model="m", prompt=[1, 2, 3]).prompt_values() == [[1, 2, 3]]
    batch = CompletionRequest(model="m", prompt=[[1, 2], [3]], n=2)
    assert batch.prompt_values() == [[1, 2], [3]] and batch.choices == 2
    assert CompletionRequest(model="m", prompt="x", stop="END").stop_strings() == ("END",)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": ["a"] * 129}, "prompt"),
        ({"model": "m", "prompt": "x", "n": 2, "best_of": 3}, "best_of"),
        ({"model": "m", "prompt": "x", "top_k": -2}, "top_k"),
        (
            {"model": "m", "prompt": "x", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"model": "m", "prompt": "x", "logit_bias": {"x": 1}}, "logit_bias"),
        ({"model": "m", "prompt": "x", "presence_penalty": 3}, "presence_penalty"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "temperature": -1}, "temperature"),
        ({"model": "m", "prompt": "x", "stop": [""]}, "stop"),
        ({"model": "m", "prompt": "x", "echo": True}, "echo"),
        ({"model": "m"}, "prompt"),
    ],
)
def test_completion_request_refuses_what_it_cannot_honour(body, field):
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate(body)
    message, param = validation_message(caught.value.errors())
    assert param is not None and param.startswith(field)
    assert field in message


def test_chat_request():
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "max_completion_tokens": 5,
            "max_tokens": 9,
            "logprobs": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert request.messages[0].text() == "ab"
    assert request.token_limit() == 5
    assert request.num_logprobs() == 0
    assert request.include_usage
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": []})
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
        )


def test_hash_key_command():
    made = runner.invoke(app, ["tenants", "hash-key"])
    assert made.exit_code == 0
    pair = json.loads(made.stdout)
    assert hash_key(pair["key"]) == pair["key_sha256"]
    given_key = runner.invoke(app, ["tenants", "hash-key", "abc"])
    assert given_key.stdout.strip() == hash_key("abc")
    piped = runner.invoke(app, ["tenants", "hash-key", "-"], input="abc\n")
    assert piped.stdout.strip() == hash_key("abc")


def test_check_command(tmp_path):
    good = write(tmp_path, json.dumps(tenants_yaml()))
    result = runner.invoke(app, ["tenants", "check", str(good)])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["tenants"] == ["team-a", "team-b"]
    assert json.loads(result.stdout)["acts_for_tenants"] == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  - name: t\n    weight: -1\n")
    result = runner.invoke(app, ["tenants", "check", str(bad)])
    assert result.exit_code == 2
    assert "tenants.0.weight" in result.output


runner = CliRunner()
