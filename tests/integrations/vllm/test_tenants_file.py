"""The plugin's weights and groups from the gateway's tenants file, re-read when it
changes (integrations/vllm/tenants_watch.py)."""

from __future__ import annotations

import logging

import pytest
import yaml

from tests.integrations.vllm.harness import make_scheduler
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.integrations.vllm import FairScheduler
from tokenfair.integrations.vllm.config import PluginConfigError, load_plugin_config
from tokenfair.integrations.vllm.tenants_watch import TenantsFileWatch

KEY = "0" * 63


def write_tenants(path, weights: dict[str, float], groups: dict[str, str] | None = None):
    tenants = []
    for index, (name, weight) in enumerate(weights.items()):
        tenant = {"name": name, "key_sha256": [f"{KEY}{index}"], "weight": weight}
        if groups and name in groups:
            tenant["group"] = groups[name]
        tenants.append(tenant)
    data = {"tenants": tenants}
    if groups:
        data["groups"] = {g: {"weight": 2} for g in sorted(set(groups.values()))}
    path.write_text(yaml.safe_dump(data))
    return path


def test_weights_and_groups_come_from_the_tenants_file(tmp_path):
    path = write_tenants(tmp_path / "t.yaml", {"a": 2, "b": 1}, {"a": "org"})
    policy = load_plugin_config({"tokenfair": {"tenants_file": str(path)}}).make_policy()
    assert isinstance(policy, VTCPolicy)
    assert policy.weights == {"a": 2.0, "b": 1.0, "@org": 2.0}
    assert policy.tree.path("a") == ("@org", "a")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"weights": {"a": 3}}, "weights is given beside tenants_file"),
        ({"tenant_groups": {"a": "org"}}, "tenant_groups is given beside tenants_file"),
    ],
)
def test_weights_in_two_places_are_refused(tmp_path, extra, message):
    path = write_tenants(tmp_path / "t.yaml", {"a": 2})
    with pytest.raises(PluginConfigError, match=message):
        load_plugin_config({"tokenfair": {"tenants_file": str(path), **extra}})


def test_a_missing_or_bad_tenants_file_names_the_key_and_the_line(tmp_path):
    with pytest.raises(PluginConfigError, match=r"tokenfair.tenants_file: .*cannot read"):
        load_plugin_config({"tokenfair": {"tenants_file": str(tmp_path / "none.yaml")}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  - name: a\n    weight: -1\n")
    with pytest.raises(PluginConfigError, match=r"tokenfair.tenants_file: .*bad.yaml:3"):
        load_plugin_config({"tokenfair": {"tenants_file": str(bad)}})


def test_a_changed_file_is_put_in_force_and_a_bad_one_is_refused(tmp_path, caplog):
    path = write_tenants(tmp_path / "t.yaml", {"a": 2, "b": 1}, {"a": "org"})
    config = load_plugin_config({"tokenfair": {"tenants_file": str(path)}})
    policy = config.make_policy()
    log = logging.getLogger("test.tenants")
    watch = TenantsFileWatch(str(path), policy, config.shares()[1], 5.0, log)
    write_tenants(path, {"a": 4, "b": 1, "c": 3}, {"a": "org"})
    assert not watch.poll(now=0.0)  # not due yet: one stat every 5 s at most
    assert watch.poll(now=10**9)
    assert policy.weights["a"] == 4.0 and policy.weights["c"] == 3.0
    assert not watch.poll(now=2 * 10**9)  # unchanged: not read again
    # A file that does not parse, and one that moves a tenant, leave the weights alone.
    path.write_text("tenants: [")
    with caplog.at_level(logging.ERROR, logger="test.tenants"):
        assert not watch.poll(now=3 * 10**9)
    write_tenants(path, {"a": 8, "b": 1}, {"a": "other"})
    with caplog.at_level(logging.ERROR, logger="test.tenants"):
        assert not watch.poll(now=4 * 10**9)
    assert policy.weights["a"] == 4.0
    assert "not reloaded" in caplog.text and "moves from" in caplog.text


def test_the_scheduler_reads_the_file_and_follows_it(tiny_model_dir, tmp_path):
    path = write_tenants(tmp_path / "t.yaml", {"a": 2, "b": 1})
    scheduler = make_scheduler(
        tiny_model_dir,
        FairScheduler,
        tokenfair={"tenants_file": str(path), "tenants_reload_s": 0.01},
    )
    policy = scheduler.driver.policy
    assert policy.weights == {"a": 2.0, "b": 1.0}
    write_tenants(path, {"a": 5, "b": 1})
    scheduler._tenants_watch._checked = -1.0  # due now
    scheduler.schedule()
    assert policy.weights == {"a": 5.0, "b": 1.0}
