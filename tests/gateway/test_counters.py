"""The gateway's VTC counters in one process equal the core's VTC (shared through
Redis: test_shared_counters.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfair.core.policies import make_policy
from tokenfair.core.request import Request
from tokenfair.core.share_tree import ShareTree
from tokenfair.gateway.replicas.counters import LocalCounters

TENANTS = ["a", "b", "c", "d"]
# A tree: a and b in team o1/t1 of org o1 (weight 2), c in o1 directly, d at the top.
GROUPS = {"o1": None, "o1/t1": "o1"}
MEMBERS = {"a": "o1/t1", "b": "o1/t1", "c": "o1"}
TREE_WEIGHTS = {"@o1": 2.0, "@o1/t1": 1.0, "a": 1.0, "b": 3.0, "c": 1.0, "d": 1.0}
# An operation: ("arrive", tenant, _), ("pick", _, prompt), ("leave", tenant, _),
# ("out", tenant, tokens), ("take", tenant, prompt): arrives and goes at once (nothing waits)
ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "arrive", "pick", "pick", "leave", "out", "take"]),
        st.sampled_from(TENANTS),
        st.integers(1, 500),
    ),
    max_size=60,
)


class Shares:
    """Each tenant's path and the charge of a service along it, flat or grouped."""

    def __init__(self, grouped: bool) -> None:
        self.tree = ShareTree.build(GROUPS, MEMBERS) if grouped else ShareTree()
        self.weights = TREE_WEIGHTS if grouped else {}

    def path(self, tenant: str) -> tuple[str, ...]:
        return self.tree.path(tenant)

    def charge(self, tenant: str, service: float) -> tuple[tuple[str, float], ...]:
        return tuple((n, service / self.weights.get(n, 1.0)) for n in self.path(tenant))


def _ordered(candidates: list[str], first: str) -> list[str]:
    return [first, *(c for c in candidates if c != first)]


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "grouped"])
@pytest.mark.parametrize(
    "spec,lift", [("vtc", "paper"), ("vtc-artifact", "artifact"), ("lcf", "none")]
)
@given(sequence=ops)
@settings(max_examples=100, deadline=None)
def test_local_counters_follow_the_core_vtc(
    spec: str, lift: str, grouped: bool, sequence: list[tuple[str, str, int]]
) -> None:
    if grouped and spec == "vtc-artifact":
        return  # the artifact's queue has no groups
    shares = Shares(grouped)
    core = make_policy(spec, weights=shares.weights or None, tree=shares.tree)
    local = LocalCounters(lift)
    ids = itertools.count()
    running: dict[str, list[Request]] = {t: [] for t in TENANTS}
    for op, tenant, n in sequence:
        if op == "arrive":
            core.add(Request(str(next(ids)), tenant, input_tokens=n, arrival_s=0.0), 0.0)
            local.arrive(tenant, shares.path(tenant))
        elif op == "pick" and len(core):
            head = core.pop()
            core.on_admit(head, True, 0.0)
            waiting = [t for t, k in local.waiting.items() if k > 0]
            # The core's choice must come first down the tree here too; among equal
            # counters the gateway takes the first candidate, so list the core's first.
            chosen, _ = local.pick(
                [
                    (t, shares.charge(t, 1.0 * head.input_tokens if t == head.client else 0.0))
                    for t in _ordered(waiting, head.client)
                ]
            )
            assert chosen == head.client
            running[head.client].append(head)
        elif op == "take" and not local.waiting:
            # The gateway's fast path, taken only when nothing waits: the core would
            # admit the lone request it has just been given.
            core.add(Request(str(next(ids)), tenant, input_tokens=n, arrival_s=0.0), 0.0)
            head = core.pop()
            core.on_admit(head, True, 0.0)
            local.arrive_and_take(tenant, shares.charge(tenant, 1.0 * n))
            running[tenant].append(head)
        elif op == "leave" and local.waiting.get(tenant):
            victim = next(r for r in core.waiting_requests() if r.client == tenant)
            core.remove(victim)
            local.leave(tenant)
        elif op == "out" and running[tenant]:
            request = running[tenant][0]
            request.extend_output([0] * n)
            core.on_output(request, n)
            local.charge(shares.charge(tenant, 2.0 * n))
        expected = core.node_counters() if grouped else core.counters()
        for node in {*expected, *local.counter}:
            assert local.counter.get(node, 0.0) == pytest.approx(expected.get(node, 0.0))
