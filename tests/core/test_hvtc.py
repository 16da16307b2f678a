"""Hierarchical VTC on random trees and overloaded workloads (docs/fairness.md).

- a tree with no group decides exactly as weighted VTC (`VTCPolicy`);
- at every level, the counters of siblings with waiting requests stay within
  B / w_min, B = max(w_in * L_in, w_out * M), w_min the smaller of the two weights;
- two siblings backlogged over a run of steps receive weighted service within 2B;
- work conservation: a group with nothing waiting leaves its share to the busy ones;
  the server never idles while requests are unfinished (checked by the replay).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenfair.core.policies import PolicyError, make_policy
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.request import Request
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.core.share_tree import ROOT, ShareTree, ShareTreeError, group_id

from .helpers import batch_span, fake_step, make_request, run_to_end
from .test_fairness_properties import PROPERTY_SETTINGS, W_IN, W_OUT

WEIGHTS = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])


@dataclass
class TreeWorkload:
    groups: dict[str, str | None]  # group path -> parent path
    members: dict[str, str]  # client -> group path ("" = top level)
    weights: dict[str, float]  # node id -> weight
    requests: list[tuple[float, str, int, int]]  # arrival, client, input, output
    max_num_seqs: int
    kv_tokens: int
    span: int = 0  # the widest batch_span replayed so far (the bound's M, with the pool)

    def tree(self) -> ShareTree:
        return ShareTree.build(self.groups, {c: g for c, g in self.members.items() if g})


@st.composite
def tree_workloads(draw, flat: bool = False) -> TreeWorkload:
    groups: dict[str, str | None] = {}
    if not flat:
        for org in range(draw(st.integers(1, 3))):
            groups[f"o{org}"] = None
            for team in range(draw(st.integers(0, 2))):
                groups[f"o{org}/t{team}"] = f"o{org}"
    places = ["", *groups]
    members: dict[str, str] = {}
    requests = []
    for c in range(draw(st.integers(2, 6))):
        client = f"c{c}"
        members[client] = "" if flat else draw(st.sampled_from(places))
        for _ in range(draw(st.integers(4, 12))):
            arrival = float(draw(st.integers(0, 30)))
            requests.append((arrival, client, draw(st.integers(1, 24)), draw(st.integers(1, 24))))
    nodes = [group_id(g) for g in groups] + list(members)
    weights = {node: draw(WEIGHTS) for node in nodes}
    return TreeWorkload(
        groups,
        members,
        weights,
        sorted(requests),
        max_num_seqs=draw(st.integers(1, 8)),
        kv_tokens=draw(st.sampled_from([48, 64, 96])),
    )


def config(workload: TreeWorkload, **overrides) -> SchedulerConfig:
    settings_ = dict(
        kv_tokens=workload.kv_tokens,
        block_size=1,
        max_num_seqs=workload.max_num_seqs,
        max_batched_tokens=4096,
        admission="reserve",
        share_seats=False,  # the bounds are proved for a system that never preempts
    )
    settings_.update(overrides)
    return SchedulerConfig(**settings_)


def replay(workload: TreeWorkload, scheduler: Scheduler, observe=None) -> list[tuple]:
    """Run to the end; returns each request's admission order, start and finish."""
    made = [
        make_request(client=c, input_tokens=i, output_tokens=o, arrival_s=t)
        for t, c, i, o in workload.requests
    ]

    def after(out) -> None:
        workload.span = max(workload.span, batch_span(out))
        if scheduler.has_unfinished():
            assert out.scheduled, "the server idled while requests were unfinished"

    before = None if observe is None else (lambda step: observe(scheduler, made))
    run_to_end(scheduler, made, before, after)
    return [(r.admit_seq, r.scheduled_s, r.first_token_s, r.finish_s) for r in made]


def bound(workload: TreeWorkload) -> float:
    """The flat B (test_fairness_properties.bound): M the pool or the widest batch span."""
    widest = max(workload.kv_tokens, workload.span)
    return max(W_IN * max(i for _, _, i, _ in workload.requests), max(W_IN, W_OUT) * widest)


def backlogged_siblings(policy: VTCPolicy, waiting: list[Request]):
    """parent -> the set of its children with a waiting request below them."""
    by_parent: dict[str, set[str]] = {}
    for request in waiting:
        nodes = policy.tree.path(request.client)
        for parent, node in zip((ROOT, *nodes[:-1]), nodes, strict=True):
            by_parent.setdefault(parent, set()).add(node)
    return by_parent


@PROPERTY_SETTINGS
@given(tree_workloads(flat=True))
def test_one_group_of_everyone_decides_exactly_as_flat_weighted_vtc(workload):
    """The descent through a group that holds every client, with its own lift and
    charges, must make the flat case's decisions among the clients."""
    flat = Scheduler(config(workload), VTCPolicy(PolicySettings(weights=workload.weights)))
    everyone = ShareTree.build({"all": None}, dict.fromkeys(workload.members, "all"))
    weights = {**workload.weights, group_id("all"): 3.0}
    grouped = VTCPolicy(PolicySettings(weights=weights, tree=everyone))
    tree = Scheduler(config(workload), grouped)
    # Fresh request objects per run: the scheduler mutates them.
    assert replay(workload, flat) == replay(workload, tree)
    assert flat.policy.counters() == tree.policy.counters()
    assert grouped.node_counters()[group_id("all")] > 0


def test_a_flat_tree_gives_plain_vtc_through_the_registry():
    policy = make_policy("vtc", weights={"a": 2.0}, tree=ShareTree())
    assert isinstance(policy, VTCPolicy)


@PROPERTY_SETTINGS
@given(tree_workloads())
def test_backlogged_siblings_counters_stay_within_the_bound_at_every_level(workload):
    policy = VTCPolicy(PolicySettings(weights=workload.weights, tree=workload.tree()))
    worst = [0.0]

    def observe(scheduler, made):
        counters = policy.node_counters()
        limit = bound(workload)
        for siblings in backlogged_siblings(policy, list(policy.waiting_requests())).values():
            for a in siblings:
                for b in siblings:
                    w_min = min(workload.weights[a], workload.weights[b])
                    gap = (counters[a] - counters[b]) * w_min
                    worst[0] = max(worst[0], gap / limit)
                    assert gap <= limit + 1e-9, (a, b, gap, limit)

    scheduler = Scheduler(config(workload), policy)
    replay(workload, scheduler, observe)
    assert scheduler.num_preemptions == 0


def weighted_service(made: list[Request], tree: ShareTree, weights) -> dict[str, float]:
    """Each node's service so far divided by its weight."""
    totals: dict[str, float] = {}
    for r in made:
        if r.ever_admitted:
            service = W_IN * r.input_tokens + W_OUT * r.num_output_tokens
            for node in tree.path(r.client):
                totals[node] = totals.get(node, 0.0) + service / weights[node]
    return totals


@PROPERTY_SETTINGS
@given(tree_workloads())
def test_siblings_backlogged_together_receive_weighted_service_within_2b(workload):
    tree = workload.tree()
    policy = VTCPolicy(PolicySettings(weights=workload.weights, tree=tree))
    # For each pair of siblings: the service gap when both became backlogged together.
    start: dict[tuple[str, str], float] = {}

    def observe(scheduler, made):
        service = weighted_service(made, tree, workload.weights)
        now = backlogged_siblings(policy, list(policy.waiting_requests()))
        together = {(a, b) for s in now.values() for a in s for b in s if a < b}
        for pair in list(start):
            if pair not in together:
                del start[pair]
        for a, b in together:
            gap = service.get(a, 0.0) - service.get(b, 0.0)
            if (a, b) not in start:
                start[a, b] = gap
            w_min = min(workload.weights[a], workload.weights[b])
            assert abs(gap - start[a, b]) * w_min <= 2 * bound(workload) + 1e-9, (a, b)

    replay(workload, Scheduler(config(workload), policy), observe)


def test_an_idle_group_leaves_its_share_to_its_busy_siblings():
    """Org a (weight 2) idle at first: org b gets every seat; once a is busy, 2:1."""
    tree = ShareTree.build({"a": None, "b": None}, {"x": "a", "y": "b"})
    policy = VTCPolicy(PolicySettings(weights={group_id("a"): 2.0}, tree=tree))
    scheduler = Scheduler(SchedulerConfig(kv_tokens=10_000, block_size=1, max_num_seqs=1), policy)
    for _ in range(300):
        scheduler.add_request(make_request("y", 10, 10, arrival_s=0.0), 0.0)
    served: list[str] = []
    for step in range(3000):
        if step == 500:
            for _ in range(300):
                scheduler.add_request(make_request("x", 10, 10, arrival_s=500.0), 500.0)
        out = fake_step(scheduler, float(step))
        assert out.scheduled  # never idle while work waits
        served.extend(s.request.client for s in out.scheduled)
    before, after = served[:500], served[1000:]
    assert before.count("y") == 500
    # After: x's org has weight 2 against y's 1 (service per token is equal).
    ratio = after.count("x") / after.count("y")
    assert 1.8 < ratio < 2.2, ratio


def test_each_level_shares_by_its_own_weights():
    """Two orgs 2:1; inside org a, teams 1:1; inside team a/s a heavy and a light key."""
    tree = ShareTree.build(
        {"a": None, "b": None, "a/s": "a", "a/t": "a"},
        {"heavy": "a/s", "light": "a/s", "t": "a/t", "b1": "b"},
    )
    policy = VTCPolicy(PolicySettings(weights={group_id("a"): 2.0}, tree=tree))
    scheduler = Scheduler(SchedulerConfig(kv_tokens=10_000, block_size=1, max_num_seqs=1), policy)
    for client in ("heavy", "light", "t", "b1"):
        for _ in range(400):
            scheduler.add_request(make_request(client, 8, 8), 0.0)
    served: dict[str, int] = {}
    for step in range(4000):
        out = fake_step(scheduler, float(step))
        for s in out.scheduled:
            served[s.request.client] = served.get(s.request.client, 0) + 1
    org_a = served["heavy"] + served["light"] + served["t"]
    assert org_a / served["b1"] == pytest.approx(2.0, rel=0.05)
    assert (served["heavy"] + served["light"]) / served["t"] == pytest.approx(1.0, rel=0.05)
    assert served["heavy"] / served["light"] == pytest.approx(1.0, rel=0.05)


def test_tree_errors_name_the_group():
    with pytest.raises(ShareTreeError, match="parent group 'nowhere'"):
        ShareTree.build({"a": "nowhere"}, {})
    with pytest.raises(ShareTreeError, match="group 'b' does not exist"):
        ShareTree.build({"a": None}, {"x": "b"})
    with pytest.raises(ShareTreeError, match="own ancestor"):
        ShareTree.build({"a": "b", "b": "a"}, {})


def test_policies_that_cannot_share_by_groups_are_refused():
    tree = ShareTree.build({"a": None}, {"x": "a"})
    with pytest.raises(PolicyError, match="does not share by groups"):
        make_policy("vtc-predict", tree=tree)
    assert make_policy("wvtc", tree=tree).name == "wvtc"
    lcf = make_policy("lcf", tree=tree)
    assert isinstance(lcf, VTCPolicy) and lcf.ledger.lift == "none" and not lcf.tree.flat


def test_groups_pay_a_cached_prompt_token_at_the_share_the_policy_is_given():
    tree = ShareTree.build({"a": None}, {"x": "a"})
    policy = make_policy("vtc", tree=tree, charge_cached_tokens=0.25)
    request = make_request("x", input_tokens=100, output_tokens=4)
    request.cached_tokens = 80
    policy.add(request, 0.0)
    policy.on_admit(policy.pop(), True, 0.0)
    # 20 computed tokens at full price, 80 cached at a quarter: 40 for the key and its group.
    assert policy.node_counters() == {"@a": 40.0, "x": 40.0}
