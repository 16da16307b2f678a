"""A policy of one's own, named `package.module:Class(key=value)` or installed under
the `tokenfair.policies` entry point group: how it is built, and each mistake's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.user_policies import install_distribution, install_module
from tokenfair.core.cost import LinearCost
from tokenfair.core.policies import PolicyError, make_policy
from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.core.policies.loading import (
    installed_policies,
    is_user_spec,
    parse_spec,
    split_policies,
)
from tokenfair.core.policies.registry import is_builtin, uses_weights
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.share_tree import ShareTree


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return install_module(tmp_path, monkeypatch)


def requests() -> list[Request]:
    return [Request(f"r{i}", "a", 10, float(i), SamplingParams(max_tokens=4)) for i in range(3)]


def pop_order(policy) -> list[str]:
    for request in requests():
        policy.add(request, request.arrival_s)
    order = []
    while len(policy):
        order.append(policy.pop().request_id)
    return order


def test_a_class_is_built_with_the_settings_and_its_arguments(module: str) -> None:
    weights = {"a": 2.0}
    cost = LinearCost(1.0, 3.0)
    tree = ShareTree()
    policy = make_policy(
        f"{module}:Newest(scale=2.5, tag='x,y')",
        weights=weights,
        cost=cost,
        charge_cached_tokens=0.5,
        tree=tree,
    )
    assert type(policy).__name__ == "Newest" and policy.name == "Newest"
    assert (policy.scale, policy.tag) == (2.5, "x,y")
    settings = policy.settings
    assert isinstance(settings, PolicySettings)
    # The policy's own copy of the weights, as built-in policies get.
    assert settings.weights == weights and settings.weights is not weights
    assert settings.cost is cost and settings.tree is tree
    assert settings.charge_cached_tokens == 0.5
    # It runs: newest first, where fcfs keeps arrival order.
    assert pop_order(policy) == ["r2", "r1", "r0"]
    assert pop_order(make_policy("fcfs")) == ["r0", "r1", "r2"]


def test_defaults_without_settings_and_a_class_keeping_its_own_charge(module: str) -> None:
    policy = make_policy(f"{module}:Newest")
    assert policy.settings == PolicySettings()
    own = make_policy(f"{module}:OwnCharge", charge_cached_tokens=0.0)
    # make_policy gives it the settings and leaves the class's own attributes alone
    assert own.charge_cached_tokens == 0.25 and own.settings.charge_cached_tokens == 0.0


def test_uses_weights_is_read_from_the_class(module: str) -> None:
    assert uses_weights(f"{module}:Newest(scale=2)")  # needs = Needs(weights=True)
    assert uses_weights(f"{module}:OldStyle")  # uses_weights = True, as before
    assert not uses_weights(f"{module}:Plain")
    assert uses_weights("vtc") and not uses_weights("fcfs")
    assert not uses_weights("tf_no_such_policy_module:X")  # building it says why


def test_the_built_policy_carries_what_it_declared(module: str) -> None:
    needs = {
        spec: make_policy(spec).needs
        for spec in ("vtc", "dlpm", "fcfs", *(f"{module}:{c}" for c in ("Newest", "Cached")))
    }
    assert needs["dlpm"].prefix_cache and needs["dlpm"].weights
    assert not needs["vtc"].prefix_cache and needs["vtc"].weights
    assert not needs["fcfs"].weights
    assert needs[f"{module}:Newest"].weights and not needs[f"{module}:Newest"].prefix_cache
    # A class overriding attach_prefix_cache, from before declarations, asks for it.
    assert needs[f"{module}:Cached"].prefix_cache
    assert make_policy(f"{module}:DeclaresTheCache").needs.prefix_cache


def test_built_in_names_stay_built_in() -> None:
    assert isinstance(make_policy("fcfs"), FCFSPolicy)
    assert is_builtin("rpm:20") and is_builtin("VTC") and not is_builtin("a.b:C")
    assert not is_user_spec("vtc") and not is_user_spec("sjf:Foo")
    assert is_user_spec("mypkg.mod:MyPolicy(x=1)") and not is_user_spec("nope")
    assert not is_user_spec("vtc-preemt:100")  # a typo, not a module


@pytest.mark.parametrize(
    ("spec", "arguments"),
    [
        ("a.b:C", {}),
        ("a.b:C()", {}),
        (" a.b : C ( x = 1 ,y='s', z=[1, 2.5], w={'k': None}, v=True, n=-3 ) ", None),
    ],
)
def test_the_argument_grammar(spec: str, arguments: dict | None) -> None:
    parsed = parse_spec(spec)
    assert (parsed.module, parsed.attr) == ("a.b", "C")
    expected = (
        arguments
        if arguments is not None
        else {
            "x": 1,
            "y": "s",
            "z": [1, 2.5],
            "w": {"k": None},
            "v": True,
            "n": -3,
        }
    )
    assert parsed.arguments == expected


def test_a_comma_separated_list_keeps_commas_inside_arguments() -> None:
    assert split_policies("fcfs, m:P(a=1, b='x,y)'),rpm:20,, n:Q([1,2])") == [
        "fcfs",
        "m:P(a=1, b='x,y)')",
        "rpm:20",
        "n:Q([1,2])",
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "tf_no_such_policy_module:X",
            "cannot import module 'tf_no_such_policy_module': No module named 'tf_no_such_policy_module'",
        ),
        (
            "{m}_broken:X",
            "cannot import module 'tf_user_policies_broken': No module named 'tf_missing_dependency'",
        ),
        ("{m}_syntax:X", "importing module 'tf_user_policies_syntax' failed: SyntaxError"),
        (
            "{m}:Nope",
            "module 'tf_user_policies' has no class 'Nope' (its policies: Broken, Cached, DeclaresTheCache, Newest, NotInVllm, OldStyle, OwnCharge, Plain)",
        ),
        (
            "{m}:NotAPolicy",
            "tf_user_policies:NotAPolicy is not a policy class (a subclass of tokenfair.core.policies.base.Policy)",
        ),
        (
            "{m}:Newest(foo=1)",
            "does not take these arguments: got an unexpected keyword argument 'foo'",
        ),
        ("{m}:Newest(scale='a')", "Newest(settings, ...): TypeError: '<=' not supported"),
        ("{m}:Newest(2)", "only keyword arguments are taken"),
        ("{m}:Newest(**{{}})", "only keyword arguments are taken"),
        (
            "{m}:Newest(scale=big)",
            "argument scale=big is not a Python literal (quote a string: scale='big')",
        ),
        ("{m}:Newest(scale=__import__('os'))", "is not a Python literal"),
        ("{m}:Newest(scale=1", "the argument list does not end with ')'"),
        ("{m}:Newest(scale=)", "malformed argument list"),
        ("{m}:Newest(scale=1)+(2)", "malformed argument list"),
        ("{m}:Newest(scale=1, scale=2)", "argument 'scale' is given twice"),
        ("{m}:Newest(scale=0)", "scale must be > 0, got 0"),
        ("nope", "unknown policy 'nope'; known policies: fcfs,"),
        ("vtc(x=1)", "'vtc' is a built-in policy, which takes no key=value arguments"),
    ],
)
def test_each_mistake_is_one_line_naming_the_spec(
    module: str, tmp_path: Path, spec: str, expected: str
) -> None:
    (tmp_path / f"{module}_broken.py").write_text("import tf_missing_dependency\n")
    (tmp_path / f"{module}_syntax.py").write_text("def broken(:\n")
    spec = spec.format(m=module)
    with pytest.raises(PolicyError) as error:
        make_policy(spec)
    message = str(error.value)
    assert "\n" not in message
    assert expected in message
    assert repr(spec) in message or "unknown policy" in message


def test_an_installed_policy_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_distribution(tmp_path, monkeypatch)
    policy = make_policy("newest(scale=3)", weights={"a": 2.0})
    assert type(policy).__name__ == "Newest" and policy.scale == 3
    assert policy.name == "newest"  # the name it was installed under
    assert is_user_spec("newest") and is_user_spec("newest(scale=3)")
    # A built-in name wins over an entry point of the same name.
    assert isinstance(make_policy("vtc"), VTCPolicy)
    listed = installed_policies()
    assert listed["newest"] == "Newest arrival first (last come, first served)."
    assert listed["plain"] == "First in, first out, without a sort key."
    assert listed["broken"].startswith("cannot load: policy 'broken' (entry point ")
    assert "No module named 'tf_no_such_policy_module'" in listed["broken"]
    assert listed["vtc"] == "not used: the built-in policy 'vtc' has this name"
    with pytest.raises(PolicyError, match="cannot import module 'tf_no_such_policy_module'"):
        make_policy("broken")
    with pytest.raises(PolicyError, match="; installed: newest, plain, broken;"):
        make_policy("newer")


def test_what_reports_call_a_policy(module: str) -> None:
    from tokenfair.core.policies.loading import policy_label

    assert policy_label("vtc") == "vtc" and policy_label(" rpm:20 ") == "rpm:20"
    assert policy_label(f"{module}:Newest") == "Newest"  # the class's own name
    assert policy_label(f"{module}:Newest(scale=2)") == "Newest(scale=2)"  # one of a sweep
    spec = f"{module}:Newest(scale=2, label='mine')"
    assert policy_label(spec) == "mine"
    policy = make_policy(spec)  # the label names it; the class never sees it
    assert (policy.name, policy.scale) == ("mine", 2)
    with pytest.raises(PolicyError, match="label= takes a non-empty string"):
        make_policy(f"{module}:Newest(label='')")
    assert policy_label("tf_no_such_module:X") == "tf_no_such_module:X"  # as written


def test_a_sweep_is_every_point_of_its_grid(module: str) -> None:
    from tokenfair.core.policies.loading import policy_label, sweep_specs

    specs = sweep_specs(f"{module}:Newest(scale=[1, 2], tag=['a', 'b'], label='x')")
    assert specs == [
        f"{module}:Newest(scale=1, tag='a')",
        f"{module}:Newest(scale=1, tag='b')",
        f"{module}:Newest(scale=2, tag='a')",
        f"{module}:Newest(scale=2, tag='b')",
    ]
    assert [make_policy(s).scale for s in specs] == [1, 1, 2, 2]
    assert len({policy_label(s) for s in specs}) == 4  # the points stay apart in reports
    with pytest.raises(PolicyError, match="as a list"):
        sweep_specs(f"{module}:Newest(scale=2)")
    with pytest.raises(PolicyError, match="only a policy of one's own"):
        sweep_specs("rpm:5")
    with pytest.raises(PolicyError, match="is empty"):
        sweep_specs(f"{module}:Newest(scale=[])")
