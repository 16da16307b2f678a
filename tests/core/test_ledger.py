"""The ledger: VTC's rules written once (counters per node, the lift, charges, picks)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfair.core.cost import LinearCost, ProfiledCost
from tokenfair.core.policies import CounterLedger, PolicyRequest, PolicySettings
from tokenfair.core.policies.ledger import REBASE_AT, weighted_charge
from tokenfair.core.share_tree import ShareTree, group_id


def ledger(lift="paper", tree=None, weights=None, **settings) -> CounterLedger:
    return CounterLedger(
        PolicySettings(weights=weights or {}, tree=tree or ShareTree(), **settings), lift=lift
    )


def test_the_pick_is_the_smallest_backlogged_counter_and_the_lift_floors_a_newcomer():
    book = ledger()
    for client in ("a", "b"):
        book.activate(client)
    book.charge("a", 500.0)
    book.charge("b", 300.0)
    assert book.smallest() == "b"
    book.activate("c")  # back from idle: lifted to the smallest waiting counter
    assert book.counter("c") == 300.0
    assert list(book.backlogged_in_order()) == ["b", "c", "a"]  # ties: the older entry
    for client in ("a", "b", "c"):
        book.deactivate(client)
    assert book.smallest() is None


@pytest.mark.parametrize(("lift", "expected"), [("paper", 400.0), ("artifact", 0.0), ("none", 0.0)])
def test_with_nobody_waiting_only_the_paper_lifts_to_the_last_admitted(lift, expected):
    book = ledger(lift)
    book.activate("heavy")
    book.admitted("heavy")
    book.charge("heavy", 400.0)
    book.deactivate("heavy")
    book.activate("idle")
    assert book.counter("idle") == expected


def test_a_preempted_request_coming_back_is_not_lifted():
    book = ledger()
    book.activate("a")
    book.charge("a", 100.0)
    book.activate("b", lift=False)
    assert book.counter("b") == 0.0


def test_charges_divide_by_the_weight_of_every_node_on_the_path():
    tree = ShareTree.build({"org": None, "org/team": "org"}, {"x": "org/team"})
    weights = {group_id("org"): 2.0, group_id("org/team"): 4.0, "x": 0.5}
    book = ledger(tree=tree, weights=weights)
    book.charge("x", 8.0)
    assert book.node_counters() == {"@org": 4.0, "@org/team": 2.0, "x": 16.0}
    assert book.counters() == {"x": 16.0}
    path = [(node, weights[node]) for node in book.nodes("x")]
    assert weighted_charge(path, 8.0) == (
        ("@org", 4.0),
        ("@org/team", 2.0),
        ("x", 16.0),
    )


def test_the_descent_picks_the_least_served_group_then_its_least_served_client():
    tree = ShareTree.build({"a": None, "b": None}, {"a1": "a", "a2": "a", "b1": "b"})
    book = ledger(tree=tree)
    for client in ("a1", "a2", "b1"):
        book.activate(client)
    book.charge("a2", 10.0)  # group a: 10; b: 0
    assert book.smallest() == "b1"
    book.charge("b1", 30.0)  # a: 10 < b: 30, and inside a, a1 (0) < a2 (10)
    assert book.smallest() == "a1"
    assert book.best_of(["a2", "b1"]) == 0  # a2's group is the smaller
    assert book.best_of(["b1", "b1"]) == 0  # ties go to the first listed


def test_output_charges_come_from_the_reported_counts_and_skip_the_free_first_token():
    book = ledger(cost=ProfiledCost())
    request = PolicyRequest("r", "a", input_tokens=100, first_token_free=True)
    request.num_output_tokens = 1
    book.charge_output(request, 1)
    assert book.counter("a") == 0.0  # the prefill's own token
    request.num_output_tokens = 4
    book.charge_output(request, 3)
    assert book.counter("a") == pytest.approx(ProfiledCost().output(100, 0, 3))


def test_the_prompt_charge_prices_cached_tokens_at_their_share():
    book = ledger(cost=LinearCost(1.0, 2.0), charge_cached_tokens=0.25)
    book.charge_prompt(PolicyRequest("r", "a", input_tokens=100, cached_tokens=80))
    assert book.counter("a") == 20 + 0.25 * 80


def test_a_refund_files_the_client_again_where_it_now_belongs():
    book = ledger()
    for client in ("a", "b"):
        book.activate(client)
    book.charge("a", 100.0)
    book.charge("b", 50.0)
    assert book.smallest() == "b"
    book.charge("a", -90.0)  # a refunded prediction: its counter shrank
    book.refile("a")
    assert book.smallest() == "a"


def test_weights_change_in_place_and_bad_settings_are_refused():
    settings = PolicySettings(weights={"a": 1.0})
    book = CounterLedger(settings)
    settings.weights["a"] = 4.0  # the admin API's change
    book.charge("a", 8.0)
    assert book.counter("a") == 2.0
    for weight in (0.0, 1e-300, 1e-320, 1e300, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match=r"weight of 'a' must be a number from 0\.01 to 100"):
            PolicySettings(weights={"a": weight})
    with pytest.raises(ValueError, match="lift rule"):
        CounterLedger(lift="sometimes")  # type: ignore[arg-type]


def test_a_level_is_rebased_past_its_reference_and_reports_the_same_counters():
    tree = ShareTree.build({"org": None}, {"x": "org", "y": "org"})
    book = ledger(tree=tree, weights={"x": 0.01, "@org": 100.0})
    book.activate("x")
    book.admitted("x")
    book.charge("x", 2 * REBASE_AT)  # x's counter: 200 x REBASE_AT
    book.admitted("x")  # past REBASE_AT: x's level (the group's) moves down
    assert book.level_counter("x") == 0.0
    assert book.counter("x") == 200 * REBASE_AT  # as reported: the base added back
    assert book.level_counter("@org") == REBASE_AT / 50  # the top level is not past it
    book.activate("y")  # lifted to x's counter, as before rebasing
    assert book.counter("y") == book.counter("x")
    book.charge("y", 0.01)  # the smallest charge there is registers
    assert book.level_counter("y") == 0.01
    assert book.smallest() == "x"


@st.composite
def ledger_events(draw):
    clients = [f"c{i}" for i in range(draw(st.integers(2, 5)))]
    weights = {c: draw(st.sampled_from([0.5, 1.0, 2.0, 4.0])) for c in clients}
    grouped = draw(st.booleans())
    members = {c: draw(st.sampled_from(["g0", "g1"])) for c in clients} if grouped else {}
    tree = ShareTree.build({"g0": None, "g1": None} if grouped else {}, members)
    events = st.tuples(
        st.sampled_from(["arrive", "serve", "leave", "output"]),
        st.sampled_from(clients),
        st.integers(1, 64),
    )
    return tree, weights, draw(st.lists(events, max_size=200))


@settings(max_examples=100, deadline=None)
@given(ledger_events())
def test_rebasing_changes_no_decision(run):
    """Two ledgers, one rebasing past 64 units, the other never (dyadic weights and
    whole charges: both exact): the same picks, backlogged order and counters of the
    waiting clients throughout. (Only waiting clients are charged here: one charged
    while idle more than the threshold below its level's reference keeps that much.)"""
    tree, weights, events = run
    books = [ledger(tree=tree, weights=weights) for _ in range(2)]
    books[0].rebase_at = 64.0
    waiting: set[str] = set()
    for kind, client, tokens in events:
        for book in books:
            if kind == "arrive" and client not in waiting:
                book.activate(client)
            elif kind == "leave" and client in waiting:
                book.deactivate(client)
            elif kind == "serve" and waiting:
                picked = book.smallest()
                book.admitted(picked)
                book.charge(picked, float(tokens))
            elif kind == "output" and client in waiting:
                book.charge(client, 2.0 * tokens)
        if kind == "arrive":
            waiting.add(client)
        elif kind == "leave":
            waiting.discard(client)
        assert books[0].smallest() == books[1].smallest()
        assert list(books[0].backlogged_in_order()) == list(books[1].backlogged_in_order())
        for client in waiting:
            assert books[0].counter(client) == books[1].counter(client)
