"""The gateway's VTC counters: the Python rules equal the core's VTC, Lua equals Python."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.redis_server import RedisServer
from tokenfair.core.policies import make_policy
from tokenfair.core.request import Request
from tokenfair.core.share_tree import ShareTree
from tokenfair.gateway.replicas.counters import LocalCounters
from tokenfair.gateway.replicas.redis_store import RedisCounterStore

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


async def _replay_in_redis(
    url: str, namespace: str, lift: str, grouped: bool, sequence: list[tuple[str, str, int]]
) -> None:
    shares = Shares(grouped)
    # This checks the scripts' arithmetic, one call after another: no background flush
    # (whose charges in flight a concurrent pick would not see yet, as in production
    # for up to flush_interval_s), and a timeout a busy machine cannot outlast (which
    # would send the store to its local fallback).
    store = RedisCounterStore(
        url,
        namespace=namespace,
        lift=lift,
        gateway_id="g1",
        timeout_s=5.0,
        flush_interval_s=3600.0,
        heartbeat_s=3600.0,
        gateway_ttl_s=7200.0,
    )
    await store.start()
    local = LocalCounters(lift)
    try:
        for op, tenant, n in sequence:
            path = shares.path(tenant)
            if op == "arrive":
                expected = local.arrive(tenant, path)
                assert await store.arrive(tenant, path) == pytest.approx(expected)
            elif op == "pick" and local.waiting:
                candidates = [
                    (t, shares.charge(t, float(n + i))) for i, t in enumerate(sorted(local.waiting))
                ]
                assert await store.pick(candidates) == local.pick(candidates)[0]
            elif op == "leave" and local.waiting.get(tenant):
                await store.leave(tenant)
                local.leave(tenant)
            elif op == "take":
                expected = local.arrive_and_take(tenant, shares.charge(tenant, float(n)))
                taken = await store.arrive_and_take(tenant, shares.charge(tenant, float(n)))
                assert taken == pytest.approx(expected)
            elif op == "out":
                store.charge(shares.charge(tenant, 2.0 * n))
                local.charge(shares.charge(tenant, 2.0 * n))
        await store.heartbeat_now()
        shared = store.counters()
        for node in {*shared, *local.counter}:
            assert shared.get(node, 0.0) == pytest.approx(local.counter.get(node, 0.0))
        assert not store.degraded
    finally:
        await store.close()


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "grouped"])
@pytest.mark.parametrize("lift", ["paper", "artifact", "none"])
def test_lua_scripts_follow_the_python_rules(
    redis_server: RedisServer, lift: str, grouped: bool
) -> None:
    namespaces = itertools.count()

    @given(sequence=ops)
    @settings(
        max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    def check(sequence: list[tuple[str, str, int]]) -> None:
        asyncio.run(
            _replay_in_redis(redis_server.url, f"t{next(namespaces)}", lift, grouped, sequence)
        )

    check()


def test_a_lifted_counter_reads_back_exactly_and_keeps_its_tie(redis_server: RedisServer) -> None:
    # b is charged 2/3 (weight 3) and a is lifted to it: with 14 digits kept (Lua's
    # tostring) a's counter came back as 0.66666666666667, above b's, and Redis picked
    # b where the rules give the tie to the first candidate, a.
    sequence = [("arrive", "b", 1), ("out", "b", 1), ("arrive", "a", 1), ("pick", "a", 1)]
    asyncio.run(_replay_in_redis(redis_server.url, "exact", "paper", True, sequence))


def test_two_gateways_share_the_lift_and_the_order(redis_server: RedisServer) -> None:
    async def run() -> None:
        one = RedisCounterStore(redis_server.url, namespace="two", gateway_id="g1")
        two = RedisCounterStore(redis_server.url, namespace="two", gateway_id="g2")
        await one.start()
        await two.start()
        try:
            await one.arrive("a", ("a",))
            assert await one.pick([("a", (("a", 1000.0),))]) == "a"
            await one.arrive("a", ("a",))  # a waits at g1 with counter 1000
            # b arrives at g2: it is lifted to the smallest counter waiting anywhere.
            assert await two.arrive("b", ("b",)) == pytest.approx(1000.0)
            one.charge((("a", 5.0),))
            await one.arrive("c", ("c",))
            # g2 picks between b (1000) and a's 1005 only if it had a; it has b alone.
            assert await two.pick([("b", (("b", 10.0),))]) == "b"
            await two.arrive("b", ("b",))
            assert await two.pick([("b", (("b", 1.0),))]) == "b"
        finally:
            await one.close()
            await two.close()

    asyncio.run(run())


def test_a_dead_gateway_stops_counting_as_waiting(redis_server: RedisServer) -> None:
    async def run() -> None:
        dead = RedisCounterStore(
            redis_server.url, namespace="ttl", gateway_id="dead", gateway_ttl_s=0.3
        )
        await dead.start()
        dead.charge((("a", 500.0),))
        await dead.arrive("a", ("a",))  # a waits at a gateway that then vanishes
        await dead.close()
        alive = RedisCounterStore(
            redis_server.url, namespace="ttl", gateway_id="alive", gateway_ttl_s=0.3
        )
        await alive.start()
        try:
            await asyncio.sleep(0.4)
            # Nobody waits any more: b is lifted to the last admitted tenant (none yet) only.
            assert await alive.arrive("b", ("b",)) == 0.0
        finally:
            await alive.close()

    asyncio.run(run())


def test_a_call_that_succeeds_after_another_failed_is_counted_once(
    redis_server: RedisServer,
) -> None:
    """An outage seen by one call while another is in flight: the one that still
    succeeds must reach the local counters too, or its tenant stays waiting for good."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    async def run() -> None:
        store = RedisCounterStore(
            redis_server.url, namespace="race", gateway_id="g1", probe_interval_s=0.05
        )
        await store.start()
        try:
            await store.arrive("a", ("a",))
            await store.arrive("a", ("a",))
            real_leave, real_flush = store._scripts["LEAVE"], store._scripts["FLUSH"]
            go = asyncio.Event()

            async def held_leave(**kwargs):  # type: ignore[no-untyped-def]
                await go.wait()
                return await real_leave(**kwargs)

            async def failing_flush(**kwargs):  # type: ignore[no-untyped-def]
                raise RedisConnectionError("gone")

            store._scripts["LEAVE"] = held_leave
            store._scripts["FLUSH"] = failing_flush
            leaving = asyncio.ensure_future(store.leave("a"))  # in flight
            await asyncio.sleep(0)
            store.charge((("a", 1.0),))
            await store._flush()  # fails: the store degrades while the leave is out
            assert store.degraded
            store._scripts["FLUSH"] = real_flush
            go.set()
            await leaving  # it succeeds in Redis
            while store.degraded:  # the probe reconciles
                await asyncio.sleep(0.02)
            await store.leave("a")  # the second of a's two requests leaves too
            await store.heartbeat_now()
            client = aioredis.Redis.from_url(redis_server.url)
            assert await client.hgetall("race:waiting:g1") == {}
            await client.aclose()
        finally:
            await store.close()

    asyncio.run(run())
