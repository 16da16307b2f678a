"""The gateway's config file: what it accepts, and errors that name the key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenfair.core.policies.catalog import BUILTINS
from tokenfair.gateway.config import (
    GatewayConfig,
    GatewayConfigError,
    load_config,
    parse_config,
)

GOOD = """
listen: {host: 127.0.0.1, port: 9000}
policy: vtc
redis: {url: "redis://127.0.0.1:6379/0"}
upstreams:
  - url: http://127.0.0.1:8001/v1
    models: [m]
    max_concurrent: 8
  - url: http://127.0.0.1:8002
    models: [m, other]
    max_inflight_tokens: 10000
"""


def test_a_good_config_loads() -> None:
    config = parse_config(GOOD)
    assert config.listen.port == 9000
    assert [u.url for u in config.upstreams] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert [u.name for u in config.upstreams] == ["upstream-0", "upstream-1"]
    assert config.served_models() == ["m", "other"]
    assert config.shared_counters and config.lift_rule == "paper"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("upstreams: []", "<config>:1: upstreams: List should have at least 1 item"),
        (
            "upstreams:\n  - url: http://x\n    models: [m]\n",
            "<config>:2: upstreams.0: give a capacity",
        ),
        (
            "upstreams:\n  - url: http://x\n    models: [m]\n    max_concurrent: 0\n",
            "<config>:4: upstreams.0.max_concurrent: Input should be greater than or equal to 1",
        ),
        (
            "upstreams:\n  - url: ftp://x\n    models: [m]\n    max_concurrent: 1\n",
            "<config>:2: upstreams.0.url: must be an http:// or https:// URL",
        ),
        (
            "policy: nope\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: policy: unknown or unsupported policy 'nope'",
        ),
        (
            "policy: vtc-preempt\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "policy: unknown or unsupported policy 'vtc-preempt'",
        ),
        (
            "policy: 'rpm:x'\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "policy: policy 'rpm:x': the limit must be a whole number of requests per minute",
        ),
        (
            "redis: {url: 'http://x'}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: redis.url: must start with redis://",
        ),
        (
            "upstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1, capacity_from_metrics: prom}\n",
            "upstreams.0.capacity_from_metrics: Input should be 'none', 'vllm' or 'tokenfair'",
        ),
        (
            "upstreams:\n  - {url: 'http://x', models: [m], max_inflight_tokens: 9, capacity_from_metrics: vllm}\n",
            "upstreams.0: capacity_from_metrics needs max_concurrent",
        ),
        (
            "listen: {prot: 1}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: listen.prot: Extra inputs are not permitted",
        ),
        (
            "upstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1, name: a}\n  - {url: 'http://y', models: [m], max_concurrent: 1, name: a}\n",
            "<config>:3: upstreams.1.name: the name 'a' of upstream 1 is used twice",
        ),
        (  # one engine twice would have its capacity counted twice
            "upstreams:\n  - {url: 'http://X:80/', models: [m], max_concurrent: 1}\n"
            "  - url: http://x/v1\n    models: [n]\n    max_concurrent: 1\n",
            "<config>:3: upstreams.1.url: http://x is upstream 'upstream-0' already: one "
            "engine listed twice would have its capacity counted twice",
        ),
        (
            "policy: fcfs\npolicy: vtc\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:2: the key 'policy' is given twice in one mapping (first at line 1)",
        ),
        (
            "upstreams:\n  - url: http://x\n    models: [m]\n    max_concurrent: 1\n    max_concurrent: 9\n",
            "<config>:5: the key 'max_concurrent' is given twice in one mapping (first at line 4)",
        ),
        (
            "upstreams:\n  - {url: 'http://x', models: [m], max_concurrent: true}\n",
            "<config>:2: upstreams.0.max_concurrent: expected a number, got the boolean true",
        ),
        (
            "cost: {w_out: false}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: cost.w_out: expected a number, got the boolean false",
        ),
        (
            "tenant_from_user: true\ntenants: tenants.yaml\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: tenant_from_user: tenant_from_user and tenants exclude each other",
        ),
        (
            "listen: {metrics_host: 0.0.0.0}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: listen: metrics_host is the address of metrics_port: give metrics_port too",
        ),
        (
            "policy: fcfs\norder_within_tenant: arrival\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:2: order_within_tenant: order_within_tenant orders a tenant's requests "
            "under the counter policies",
        ),
        (
            "upstreams:\n  - url: http://x:notaport/v1\n    models: [m]\n    max_concurrent: 1\n",
            "<config>:2: upstreams.0.url: 'http://x:notaport/v1' has no valid port",
        ),
        (
            "redis: {url: 'redis://h:99999/0'}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: redis.url: 'redis://h:99999/0' has no valid port",
        ),
        (
            "upstreams:\n  - {url: 'http://:80', models: [m], max_concurrent: 1}\n",
            "upstreams.0.url: 'http://:80' names no host",
        ),
        (
            "routing: nearest\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: routing: unknown routing 'nearest'; use prefix-affinity or least-loaded",
        ),
        (
            "upstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\nrouting:\n  mode: prefix-affinity\n  overload_bound: 1.5\n",
            "<config>:5: routing.overload_bound: Input should be less than or equal to 1",
        ),
        (
            "routing: {mode: prefix-affinity, block_bytes: 8}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: routing.block_bytes: Input should be greater than or equal to 16",
        ),
        (
            "routing:\n  mode: affinity\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:2: routing.mode: Input should be 'prefix-affinity' or 'least-loaded'",
        ),
        (
            "routing:\n  index_size: 3\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:2: routing.index_size: Extra inputs are not permitted",
        ),
        (
            "listen: {port: 8080, metrics_port: 8080}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "<config>:1: listen: metrics_port must differ from port (8080)",
        ),
        (
            "listen: {metrics_port: 0}\nupstreams:\n  - {url: 'http://x', models: [m], max_concurrent: 1}\n",
            "listen.metrics_port: Input should be greater than or equal to 1",
        ),
        ("[1, 2]", "<config>: expected a mapping"),
        ("upstreams: [", "<config>:1: not valid YAML"),
    ],
)
def test_errors_name_the_key(text: str, expected: str) -> None:
    with pytest.raises(GatewayConfigError) as raised:
        parse_config(text)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(expected) or expected in message, message


def test_routing_is_a_mode_or_a_mapping() -> None:
    assert parse_config(GOOD).routing.mode == "prefix-affinity"  # the default
    alone = parse_config("routing: least-loaded\n" + GOOD)
    assert alone.routing.mode == "least-loaded"
    tuned = parse_config("routing: {overload_bound: 0.5, max_blocks: 8}\n" + GOOD)
    assert tuned.routing.mode == "prefix-affinity"
    assert (tuned.routing.overload_bound, tuned.routing.max_blocks) == (0.5, 8)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(GatewayConfigError, match=r"nope.yaml: cannot read the config file"):
        load_config(tmp_path / "nope.yaml")


def test_groups_need_a_policy_that_shares_by_groups() -> None:
    from tokenfair.gateway.app import build_directory

    tenants = {"groups": {"org-a": {}}, "tenants": [{"name": "t", "group": "org-a"}]}
    upstreams = [{"url": "http://127.0.0.1:9/v1", "models": ["m"], "max_concurrent": 1}]
    config = GatewayConfig(policy="fcfs", tenants=tenants, upstreams=upstreams)
    with pytest.raises(GatewayConfigError, match="'fcfs' does not share by groups"):
        build_directory(config)
    grouped = build_directory(GatewayConfig(policy="vtc", tenants=tenants, upstreams=upstreams))
    assert grouped.tree.path("t") == ("@org-a", "t")


USER_POLICY = (
    "policy: '{spec}'\nupstreams:\n  - {{url: 'http://x', models: [m], max_concurrent: 1}}\n"
)


def test_a_users_keyed_policy_runs_in_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.user_policies import install_module
    from tokenfair.gateway.flow.fairness import PolicyFairness

    module = install_module(tmp_path, monkeypatch)
    spec = f"{module}:Newest(scale=2)"
    config = parse_config(USER_POLICY.format(spec=spec))
    assert config.policy == spec  # kept as written: class names are case-sensitive
    assert not config.shared_counters
    fairness = PolicyFairness(config.policy)
    assert type(fairness.policy).__name__ == "Newest" and fairness.policy.scale == 2


def test_a_users_policy_without_a_sort_key_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.user_policies import install_module

    module = install_module(tmp_path, monkeypatch)
    with pytest.raises(GatewayConfigError) as error:
        parse_config(USER_POLICY.format(spec=f"{module}:Plain"))
    assert str(error.value) == (
        f"<config>:1: policy: policy '{module}:Plain': Plain is not a KeyedPolicy; the "
        "gateway runs a policy of your own only if it orders by a static sort_key (it "
        "honours sort_key, accept and on_admit, nothing else)"
    )
    with pytest.raises(GatewayConfigError, match=r"<config>:1: policy: policy 'tf_nope\.x:P': "):
        parse_config(USER_POLICY.format(spec="tf_nope.x:P"))


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_the_gateway_runs_the_policies_that_declare_it(name: str) -> None:
    """Shared counters for a policy whose declaration gives a shared lift, a policy per
    replica for one that declares it, and a refusal naming both lists otherwise: the
    gateway keeps no list of its own."""
    declared = BUILTINS[name]
    spec = f"{name}:20" if declared.argument is not None else name
    upstreams = [{"url": "http://127.0.0.1:9/v1", "models": ["m"], "max_concurrent": 1}]
    if declared.needs.shared_lift or declared.needs.per_replica:
        config = GatewayConfig(policy=spec, upstreams=upstreams)
        assert config.shared_counters == (declared.needs.shared_lift is not None)
        if config.shared_counters:
            assert config.lift_rule == declared.needs.shared_lift
    else:
        with pytest.raises(ValueError, match="unsupported policy") as error:
            GatewayConfig(policy=spec, upstreams=upstreams)
        assert "vtc" in str(error.value) and "rpm:N" in str(error.value)
