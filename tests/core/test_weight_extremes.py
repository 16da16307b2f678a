"""Weights at both ends of their range (core/weights.py), after a long run: every charge
still registers and every counter stays finite.

The counters only grow, and VTC lifts a newcomer to the smallest counter of those
waiting: a tenant at the smallest weight served alone for a long time drags every
counter up to its own. A charge far smaller than the counter it is added to would be
lost in float64's rounding; the ledger keeps each level's counters less a base of its
own (rebasing), so a charge of 0.01 (one token at the largest weight) still moves the
counter the ledger compares (`level_counter`). The long run is a history charged before
the random workload: up to 10^13 tokens, years of a busy server.
"""

from __future__ import annotations

import math
from functools import partial

from hypothesis import given
from hypothesis import strategies as st

from tokenfair.core.policies import CounterLedger, PolicySettings
from tokenfair.core.policies.ledger import chargeable_output
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.core.share_tree import ShareTree, group_id
from tokenfair.core.weights import MAX_WEIGHT, MIN_WEIGHT

from .helpers import make_request, run_to_end
from .test_fairness_properties import PROPERTY_SETTINGS, W_IN, W_OUT

EXTREMES = st.sampled_from([MIN_WEIGHT, MAX_WEIGHT, 1.0])
# Tokens the lightest client was served alone before the workload: none, or up to
# 10^13 (10^5 tokens/s for three years).
HISTORY = st.one_of(st.just(0.0), st.floats(1e3, 1e13))


def tree_and_weights(draw, clients: list[str]) -> tuple[ShareTree, dict[str, float]]:
    """A flat tree, or two groups (at the two ends of the range) holding the clients;
    "light" weighs the least and "heavy" the most, the others at random."""
    weights = {client: draw(EXTREMES) for client in clients}
    weights.update(light=MIN_WEIGHT, heavy=MAX_WEIGHT)
    if not draw(st.booleans()):
        return ShareTree(), weights
    groups = {"slow": None, "fast": None}
    members = {client: draw(st.sampled_from(["slow", "fast"])) for client in clients}
    members.update(light="slow", heavy="fast")
    weights.update({group_id("slow"): MIN_WEIGHT, group_id("fast"): MAX_WEIGHT})
    return ShareTree.build(groups, members), weights


def serve_alone(ledger: CounterLedger, client: str, tokens: float) -> None:
    """`client` served `tokens` alone, in 100 requests."""
    if tokens <= 0:
        return
    ledger.activate(client)
    for _ in range(100):
        ledger.admitted(client)
        ledger.charge(client, tokens / 100)
    ledger.deactivate(client)


def assert_finite(ledger: CounterLedger) -> None:
    for node in ledger.node_counters():
        assert math.isfinite(ledger.counter(node)), node
        assert math.isfinite(ledger.level_counter(node)), node


def charged_registers(ledger: CounterLedger, client: str, charge) -> None:
    """Run `charge()`; every node on `client`'s path must have a larger counter after."""
    nodes = ledger.nodes(client)
    before = [ledger.level_counter(node) for node in nodes]
    charge()
    after = [ledger.level_counter(node) for node in nodes]
    for node, old, new in zip(nodes, before, after, strict=True):
        assert new > old, f"a charge to {client} did not register on {node}: {old!r}"
        assert math.isfinite(new)


@st.composite
def ledger_runs(draw):
    clients = ["light", "heavy", *(f"c{i}" for i in range(draw(st.integers(0, 3))))]
    tree, weights = tree_and_weights(draw, clients)
    events = draw(
        st.lists(
            st.tuples(
                st.sampled_from(clients),
                st.sampled_from(["arrive", "admit", "prompt", "output", "leave"]),
                st.integers(1, 10**6),
            ),
            min_size=1,
            max_size=60,
        )
    )
    lift = draw(st.sampled_from(["paper", "artifact", "none"]))
    return tree, weights, lift, draw(HISTORY), events


@PROPERTY_SETTINGS
@given(ledger_runs())
def test_every_charge_registers_at_the_extreme_weights_after_a_long_run(run):
    tree, weights, lift, history, events = run
    ledger = CounterLedger(PolicySettings(weights=weights, tree=tree), lift=lift)
    serve_alone(ledger, "light", history)
    waiting: set[str] = set()
    for client, kind, tokens in events:
        if kind == "arrive" and client not in waiting:
            ledger.activate(client)
            waiting.add(client)
        elif kind == "leave" and client in waiting:
            ledger.deactivate(client)
            waiting.discard(client)
        elif kind == "admit":
            ledger.admitted(client)
        else:  # a prompt, or one output token: the smallest charge there is
            service = W_IN * tokens if kind == "prompt" else W_OUT
            charged_registers(ledger, client, partial(ledger.charge, client, service))
        picked = ledger.smallest()
        assert (picked is None) == (not waiting)
        assert_finite(ledger)


@st.composite
def scheduler_runs(draw):
    clients = ["light", "heavy", *(f"c{i}" for i in range(draw(st.integers(0, 2))))]
    tree, weights = tree_and_weights(draw, clients)
    requests = []
    for client in clients:
        for _ in range(draw(st.integers(2, 8))):
            arrival = float(draw(st.integers(0, 20)))
            prompt, output = draw(st.integers(1, 24)), draw(st.integers(1, 24))
            requests.append((arrival, client, prompt, output))
    return tree, weights, draw(HISTORY), sorted(requests), draw(st.integers(1, 6))


@PROPERTY_SETTINGS
@given(scheduler_runs())
def test_the_scheduler_charges_register_at_the_extreme_weights_after_a_long_run(run):
    tree, weights, history, requests, max_num_seqs = run
    policy = VTCPolicy(PolicySettings(weights=weights, tree=tree))
    ledger = policy.ledger
    serve_alone(ledger, "light", history)
    charge, charge_output = ledger.charge, ledger.charge_output

    def checked_charge(client: str, service: float) -> None:
        if service > 0:
            charged_registers(ledger, client, partial(charge, client, service))
        else:
            charge(client, service)

    def checked_output(request, new_tokens: int) -> None:
        free = request.first_token_free
        if chargeable_output(request.num_output_tokens, free) > chargeable_output(
            request.num_output_tokens - new_tokens, free
        ):
            charged_registers(ledger, request.client, partial(charge_output, request, new_tokens))
        else:
            charge_output(request, new_tokens)

    ledger.charge = checked_charge  # type: ignore[method-assign]
    policy.on_output = checked_output  # type: ignore[method-assign]
    config = SchedulerConfig(
        kv_tokens=96, block_size=1, max_num_seqs=max_num_seqs, max_batched_tokens=4096
    )
    scheduler = Scheduler(config, policy)
    made = [
        make_request(client=c, input_tokens=i, output_tokens=o, arrival_s=t)
        for t, c, i, o in requests
    ]
    run_to_end(scheduler, made, after_step=lambda out: assert_finite(ledger), max_steps=5_000)
    assert all(r.num_output_tokens == r.target_output_tokens for r in made)
