"""Groups in the tenants file: the format, its errors (file, line, key), the directory."""

from __future__ import annotations

import pytest

from tokenfair.edge.directory import TenantDirectory
from tokenfair.edge.tenants import TenantsFileError, hash_key, load_tenants, parse_tenants

HEAVY, LIGHT = hash_key("k-heavy"), hash_key("k-light")
TREE = """\
groups:
  org-a:
    weight: 2
    groups:
      search: {weight: 1}
      ads: {weight: 3}
  org-b: {}
tenants:
  - {name: heavy, group: org-a/search, key_sha256: HEAVY}
  - {name: light, group: org-a/search, key_sha256: LIGHT, weight: 0.5}
  - {name: ads, group: org-a/ads}
  - {name: b1, group: org-b}
  - {name: solo}
""".replace("HEAVY", HEAVY).replace("LIGHT", LIGHT)


def write(tmp_path, text: str):
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return path


def test_a_tree_of_groups_gives_the_core_its_tree_and_every_node_its_weight(tmp_path):
    loaded = load_tenants(write(tmp_path, TREE))
    tree = loaded.share_tree()
    assert tree.path("heavy") == ("@org-a", "@org-a/search", "heavy")
    assert tree.path("b1") == ("@org-b", "b1")
    assert tree.path("solo") == ("solo",)  # no group: the top level
    weights = loaded.weights()
    assert weights["@org-a"] == 2 and weights["@org-a/ads"] == 3 and weights["@org-b"] == 1
    assert weights["light"] == 0.5


def test_a_file_without_groups_is_the_flat_tree(tmp_path):
    loaded = load_tenants(write(tmp_path, "tenants:\n  - name: t\n"))
    assert loaded.share_tree().flat


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            TREE.replace("group: org-b}", "group: org-c}"),
            r"tenants.yaml:12: tenants.3.group: no group 'org-c'",
        ),
        (
            TREE.replace("ads: {weight: 3}", "ads: {weight: 0}"),
            r"tenants.yaml:6: groups.org-a.groups.ads.weight: must be a number from 0.01 to 100",
        ),
        (
            TREE.replace("ads: {weight: 3}", "ads: {weight: 1.0e-300}"),
            r"tenants.yaml:6: groups.org-a.groups.ads.weight: must be a number from 0.01 to "
            r"100 \(weights are relative: scale them to fit\), got 1e-300",
        ),
        (
            TREE.replace("ads: {weight: 3}", "ads: {weight: true}"),
            r"tenants.yaml:6: groups.org-a.groups.ads.weight: must be a number .*, not a boolean",
        ),
        (
            TREE.replace("ads: {weight: 3}", "ads: {weight: 3, weight: 5}"),
            r"tenants.yaml:6: the key 'weight' is given twice in one mapping \(first at line 6\)",
        ),
        (
            TREE.replace("ads: {weight: 3}", "ads: {wieght: 3}"),
            r"tenants.yaml:6: groups.org-a.groups.ads.wieght: unknown key",
        ),
        (
            TREE.replace("      search:", "      se/arch:"),
            r"tenants.yaml:5: groups.org-a.groups.se/arch: a group's name is letters",
        ),
        (
            TREE.replace("{name: ads,", "{name: heavy,"),
            r"tenants.yaml:11: tenants.2.name: duplicate tenant name 'heavy'",
        ),
        (
            TREE.replace(
                f"group: org-a/search, key_sha256: {LIGHT}, weight: 0.5",
                f"group: org-a/search, key_sha256: {HEAVY}",
            ),
            r"tenants.yaml:10: tenants.1.key_sha256: key already belongs to tenant 'heavy'",
        ),
    ],
)
def test_mistakes_name_the_file_the_line_and_the_key(tmp_path, text, expected):
    with pytest.raises(TenantsFileError, match=expected):
        load_tenants(write(tmp_path, text))


def test_groups_nest_at_most_eight_deep(tmp_path):
    nested: dict = {}
    inner = nested
    for depth in range(9):
        inner[f"g{depth}"] = {"groups": {}}
        inner = inner[f"g{depth}"]["groups"]
    with pytest.raises(TenantsFileError, match="nest at most 8 deep"):
        parse_tenants({"groups": nested, "tenants": [{"name": "t"}]})


def test_the_directory_weighs_each_node_and_changes_a_group_s_weight(tmp_path):
    directory = TenantDirectory(load_tenants(write(tmp_path, TREE)))
    heavy = directory.authenticate("Bearer k-heavy", {})
    assert directory.path_weights(heavy) == (
        ("@org-a", 2.0),
        ("@org-a/search", 1.0),
        ("heavy", 1.0),
    )
    directory.set_group_weight("org-a/search", 4.0)
    assert directory.weights()["@org-a/search"] == 4.0
    assert directory.path_weights(heavy)[1] == ("@org-a/search", 4.0)
    with pytest.raises(KeyError):
        directory.set_group_weight("org-z", 1.0)


def test_a_reload_may_add_tenants_and_groups_but_not_move_them(tmp_path):
    directory = TenantDirectory(load_tenants(write(tmp_path, TREE)))
    grown = (
        TREE.replace("  org-b: {}", "  org-b: {}\n  org-c: {}") + "  - {name: c1, group: org-c}\n"
    )
    directory.replace(load_tenants(write(tmp_path, grown)))
    assert directory.tree.path("c1") == ("@org-c", "c1")
    moved = grown.replace("{name: ads, group: org-a/ads}", "{name: ads, group: org-b}")
    with pytest.raises(TenantsFileError, match="'ads' moves from '@org-a/ads' to '@org-b'"):
        directory.replace(load_tenants(write(tmp_path, moved)))
    flat = "tenants:\n  - name: t\n"
    with pytest.raises(TenantsFileError, match="restart to apply"):
        directory.replace(load_tenants(write(tmp_path, flat)))
    assert directory.tree.path("c1") == ("@org-c", "c1")  # the file in force stays
