"""The plugin's settings for hierarchical shares: a tree of groups and tenants' groups."""

from __future__ import annotations

import pytest

from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.integrations.vllm.config import PluginConfigError, load_plugin_config

TREE = {
    "groups": {"org-a": {"weight": 2, "groups": {"search": {}}}, "org-b": {}},
    "tenant_groups": {"team-a": "org-a/search", "team-b": "org-b"},
    "weights": {"team-a": 3},
}


def test_groups_make_the_policy_hierarchical():
    policy = load_plugin_config({"tokenfair": TREE}).make_policy()
    assert isinstance(policy, VTCPolicy) and not policy.tree.flat
    assert policy.tree.path("team-a") == ("@org-a", "@org-a/search", "team-a")
    assert policy.weights == {"@org-a": 2.0, "@org-a/search": 1.0, "@org-b": 1.0, "team-a": 3.0}
    flat = load_plugin_config({}).make_policy()
    assert isinstance(flat, VTCPolicy) and flat.tree.flat  # flat as before


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**TREE, "tenant_groups": {"t": "org-c"}}, "tokenfair.tenant_groups: client 't'"),
        ({"groups": {"a/b": {}}}, "tokenfair.groups.a/b.[key]"),
        ({"groups": {"a": {"weight": 0}}}, "tokenfair.groups.a.weight"),
        ({"groups": {"a": {"weight": 1000}}}, "tokenfair.groups.a.weight: must be a number"),
        ({**TREE, "policy": "vtc-predict"}, "does not share by groups"),
    ],
)
def test_bad_group_settings_name_the_key(entry, message):
    with pytest.raises(PluginConfigError) as error:
        load_plugin_config({"tokenfair": entry})
    assert message in str(error.value)
