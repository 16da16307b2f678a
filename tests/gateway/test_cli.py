"""`tokenfair gateway --check`: validate a config, and ask the upstreams and Redis once."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.gateway.processes import fake_upstream
from tests.gateway.redis_server import RedisServer
from tokenfair.cli import app
from tokenfair.edge.tenants import hash_key


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return path


def _check(tmp_path: Path, text: str) -> Result:
    """`tokenfair gateway --check` on a config of `text`."""
    path = _write(tmp_path, text)
    return CliRunner().invoke(app, ["gateway", "--config", str(path), "--check"])


def test_check_accepts_a_good_config(tmp_path: Path) -> None:
    (tmp_path / "tenants.yaml").write_text(
        f"tenants:\n  - name: a\n    key_sha256: ['{hash_key('k')}']\n"
    )
    result = _check(
        tmp_path,
        "tenants: tenants.yaml\nupstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n",
    )
    # A good config whose upstream does not answer: 1, not 2 (a wrong config), saying so.
    assert result.exit_code == 1, result.output
    assert "ok" in result.output and "1 tenant(s)" in result.output
    assert "routing prefix-affinity" in result.output
    assert "upstream upstream-0 (http://127.0.0.1:1" in result.output
    assert "unreachable" in result.output


def test_check_reaches_the_upstreams_and_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    upstream = fake_upstream(tmp_path, "u")
    try:
        result = _check(
            tmp_path,
            f"redis: {{url: '{redis_server.url}'}}\n"
            f"upstreams:\n  - {{url: '{upstream.url}/v1', models: [m], max_concurrent: 8}}\n",
        )
    finally:
        upstream.stop()
    assert result.exit_code == 0, result.output
    assert "max_concurrent 8, shared by the replicas through Redis): healthy" in result.output
    assert f"Redis {redis_server.url} (namespace 'tokenfair'): answers" in result.output


def test_check_names_a_bad_routing_key_and_line(tmp_path: Path) -> None:
    result = _check(
        tmp_path,
        "upstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n"
        "routing:\n  mode: least-loaded\n  overload_bound: -1\n",
    )
    assert result.exit_code == 2
    assert "gateway.yaml:5: routing.overload_bound" in result.output


def test_check_names_the_bad_key(tmp_path: Path) -> None:
    result = _check(
        tmp_path, "upstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: -1}\n"
    )
    assert result.exit_code == 2
    assert "gateway.yaml:2: upstreams.0.max_concurrent" in result.output
    assert "Traceback" not in result.output


def test_check_reports_a_bad_tenants_file_by_its_key(tmp_path: Path) -> None:
    (tmp_path / "tenants.yaml").write_text("tenants:\n  - name: a\n    weight: 0\n")
    result = _check(
        tmp_path,
        "tenants: tenants.yaml\nupstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n",
    )
    assert result.exit_code == 2
    assert "tenants.yaml:3: tenants.0.weight" in result.output  # file, line and key


def test_inline_tenants_are_checked_too(tmp_path: Path) -> None:
    result = _check(
        tmp_path,
        "tenants: {tenants: [{name: a, rpm: 0}]}\nupstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n",
    )
    assert result.exit_code == 2
    assert "gateway.yaml:1: tenants.tenants.0.rpm" in result.output  # the file and line


def test_check_refuses_a_key_given_twice_at_its_line(tmp_path: Path) -> None:
    """`policy: fcfs` then `policy: vtc`: YAML keeps the last; --check must not report
    either as the one in force."""
    result = _check(
        tmp_path,
        "policy: fcfs\nupstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n"
        "policy: vtc\n",
    )
    assert result.exit_code == 2
    assert "gateway.yaml:4: the key 'policy' is given twice in one mapping (first at line 1)" in (
        " ".join(result.output.split())
    )
    assert "ok" not in result.output


def test_check_refuses_a_weight_out_of_range_and_a_key_twice_inline(tmp_path: Path) -> None:
    for tenants, expected in (
        ("{tenants: [{name: a, weight: 1.0e-300}]}", "gateway.yaml:1: tenants.tenants.0.weight"),
        ("{tenants: [{name: a, weight: 1, weight: 5}]}", "gateway.yaml:1: the key 'weight'"),
    ):
        result = _check(
            tmp_path,
            f"tenants: {tenants}\nupstreams:\n  - {{url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}}\n",
        )
        assert result.exit_code == 2
        assert expected in result.output


def test_check_loads_the_tokenizers_as_the_start_does(tmp_path: Path) -> None:
    result = _check(
        tmp_path,
        "models: {m: {tokenizer: /nonexistent/tokenizer}}\n"
        "upstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n",
    )
    assert result.exit_code == 2
    assert "gateway.yaml: models.m.tokenizer: cannot load '/nonexistent/tokenizer'" in " ".join(
        result.output.split()
    )


INLINE = """upstreams:
  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}
tenants:
  tenants:
    - name: a
      key_sha256: ['%s']
    - name: %s
      key_sha256: ['%s']
"""


@pytest.mark.parametrize(
    "second,key,expected",
    [
        ("a", "b", ":7: tenants.tenants.1.name: duplicate tenant name 'a'"),
        ("b", "a", ":8: tenants.tenants.1.key_sha256: key already belongs to tenant 'a'"),
    ],
    ids=["name", "key"],
)
def test_a_duplicate_in_inline_tenants_is_reported_at_its_line(
    tmp_path: Path, second: str, key: str, expected: str
) -> None:
    text = INLINE % (hash_key("a"), second, hash_key(key))
    result = _check(tmp_path, text)
    assert result.exit_code == 2
    assert f"{tmp_path / 'gateway.yaml'}{expected}" in " ".join(result.output.split()), (
        result.output
    )


def test_a_second_replica_takes_its_metrics_port_by_flag(tmp_path: Path) -> None:
    # docs/deploy.md runs two replicas from one config on one machine.
    (tmp_path / "tenants.yaml").write_text(
        f"tenants:\n  - name: a\n    key_sha256: ['{hash_key('k')}']\n"
    )
    path = _write(
        tmp_path,
        "listen: {port: 8080, metrics_port: 9100}\ntenants: tenants.yaml\n"
        "upstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n",
    )
    base = ["gateway", "--config", str(path), "--port", "8081"]
    clash = CliRunner().invoke(app, [*base, "--metrics-port", "8081", "--check"])
    assert clash.exit_code == 2 and "give each its own" in clash.output
    fine = CliRunner().invoke(app, [*base, "--metrics-port", "9101", "--check"])
    assert fine.exit_code == 1 and "ok" in fine.output  # only the upstream is missing
