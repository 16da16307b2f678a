"""VTC's counters shared by gateway replicas through Redis (a real redis-server).

Each replica decides on its own copy and merges it with Redis in the background. Two
properties on random workloads:

- merged after every step, the replicas decide as one VTC does (the lift, the pick
  down the group tree, the charges: the core's ledger in one process);
- merged only now and then, a backlogged tenant's counter never runs further ahead of
  another backlogged tenant's than one request plus the requests the deciding replica
  had not heard of: the staleness bound docs/deploy.md states.
"""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.redis_server import RedisServer, commands_run
from tests.gateway.test_counters import TENANTS, Shares
from tokenfair.gateway.replicas.counters import LocalCounters
from tokenfair.gateway.replicas.redis_store import RedisCounterStore

REPLICAS = 3
# (replica, operation, tenant, amount), as in test_counters.py.
steps = st.lists(
    st.tuples(
        st.integers(0, REPLICAS - 1),
        st.sampled_from(["arrive", "arrive", "pick", "pick", "leave", "out", "take"]),
        st.sampled_from(TENANTS),
        st.integers(1, 500),
    ),
    max_size=50,
)
namespaces = itertools.count()


def _store(url: str, namespace: str, replica: int, lift: str = "paper") -> RedisCounterStore:
    # No background sync (the test merges when it means to), and a timeout that a busy
    # machine cannot outlast.
    return RedisCounterStore(
        url,
        namespace=namespace,
        gateway_id=f"g{replica}",
        lift=lift,
        timeout_s=5.0,
        flush_interval_s=3600.0,
        heartbeat_s=3600.0,
        gateway_ttl_s=7200.0,
        sync_every=10**9,
    )


async def _as_one_vtc(
    url: str, lift: str, grouped: bool, sequence: list[tuple[int, str, str, int]]
) -> None:
    shares = Shares(grouped)
    namespace = f"one{next(namespaces)}"
    stores = [_store(url, namespace, r, lift) for r in range(REPLICAS)]
    for store in stores:
        await store.start()
    one = LocalCounters(lift)  # the whole fleet's waiting requests, in one ledger
    waiting: list[dict[str, int]] = [{} for _ in stores]  # what waits at each replica
    try:
        for replica, op, tenant, n in sequence:
            store, here = stores[replica], waiting[replica]
            path = shares.path(tenant)
            if op == "arrive":
                expected = one.arrive(tenant, path)
                assert await store.arrive(tenant, path) == pytest.approx(expected)
                here[tenant] = here.get(tenant, 0) + 1
            elif op == "pick" and here:
                candidates = [
                    (t, shares.charge(t, float(n + i))) for i, t in enumerate(sorted(here))
                ]
                chosen = one.pick(candidates)[0]
                assert await store.pick(candidates) == chosen
                here[chosen] -= 1
                if not here[chosen]:
                    del here[chosen]
            elif op == "leave" and here.get(tenant):
                one.leave(tenant)
                await store.leave(tenant)
                here[tenant] -= 1
                if not here[tenant]:
                    del here[tenant]
            elif op == "take":
                expected = one.arrive_and_take(tenant, shares.charge(tenant, float(n)))
                taken = await store.arrive_and_take(tenant, shares.charge(tenant, float(n)))
                assert taken == pytest.approx(expected)
            elif op == "out":
                one.charge(shares.charge(tenant, 2.0 * n))
                store.charge(shares.charge(tenant, 2.0 * n))
            # The one that acted first, so that every other copy hears of it.
            for other in [store, *(s for s in stores if s is not store)]:
                await other.sync()
        for store in stores:
            copy = store.counters()
            for node in {*copy, *one.counter}:
                assert copy.get(node, 0.0) == pytest.approx(one.counter.get(node, 0.0))
            assert not store.degraded
    finally:
        for store in stores:
            await store.close()


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "grouped"])
@pytest.mark.parametrize("lift", ["paper", "artifact", "none"])
def test_replicas_merged_at_every_step_decide_as_one_vtc(
    redis_server: RedisServer, lift: str, grouped: bool
) -> None:
    @given(sequence=steps)
    @settings(
        max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    def check(sequence: list[tuple[int, str, str, int]]) -> None:
        asyncio.run(_as_one_vtc(redis_server.url, lift, grouped, sequence))

    check()


async def _gap_with_stale_copies(
    url: str, seed: int, replicas: int, merge_every: int, weights: dict[str, float]
) -> tuple[float, float]:
    """Tenants a and b wait at every replica for the whole run; at each step a random
    replica dispatches one request, choosing by its copy; each replica merges now and
    then, at most `merge_every` of its dispatches apart. Returns the largest gap
    between their true weighted counters, and its bound: one request plus those the
    deciding copy had not heard of, at the largest weighted cost."""
    rng = random.Random(seed)
    namespace = f"stale{next(namespaces)}"
    stores = [_store(url, namespace, r) for r in range(replicas)]
    for store in stores:
        await store.start()
        for tenant in weights:  # twice: still waiting once a request of it goes
            await store.arrive(tenant, (tenant,))
            await store.arrive(tenant, (tenant,))
    for store in stores:
        await store.sync()
    truth = dict.fromkeys(weights, 0.0)  # every charge, applied at once
    biggest = 2000.0 / min(weights.values())
    merges = itertools.count(1)
    heard = [0] * replicas  # the merge (in order) at which each copy last merged
    unmerged: list[list[int]] = [[] for _ in stores]  # each copy's dispatches not sent
    sent_at: list[int] = []  # per dispatch: the merge that sent it
    made_by: list[int] = []
    since_merge = [0] * replicas
    unheard_most, gap = 0, 0.0

    async def merge(q: int) -> None:
        await stores[q].sync()
        heard[q] = next(merges)
        for d in unmerged[q]:
            sent_at[d] = heard[q]
        unmerged[q].clear()
        since_merge[q] = 0

    try:
        for _ in range(200):
            r = rng.randrange(replicas)
            unheard = sum(
                1
                for d, q in enumerate(made_by)
                if q != r and (sent_at[d] == 0 or sent_at[d] > heard[r])
            )
            unheard_most = max(unheard_most, unheard)
            cost = float(rng.randint(1, 2000))
            candidates = [(t, ((t, cost / w),)) for t, w in weights.items()]
            chosen = await stores[r].pick(candidates)
            await stores[r].arrive(chosen, (chosen,))  # it still has one waiting
            truth[chosen] += cost / weights[chosen]
            gap = max(gap, abs(truth["a"] - truth["b"]))
            sent_at.append(0)
            made_by.append(r)
            unmerged[r].append(len(made_by) - 1)
            since_merge[r] += 1
            if since_merge[r] >= merge_every or rng.random() < 0.2:
                await merge(r)
        for q in [*range(replicas), *range(replicas)]:  # the first hear the last too
            await merge(q)
        for store in stores:  # every charge reached Redis once, and every copy
            assert store.counters() == pytest.approx(truth)
    finally:
        for store in stores:
            await store.close()
    return gap, (unheard_most + 1) * biggest


@given(
    seed=st.integers(0, 2**32 - 1),
    replicas=st.integers(2, 4),
    merge_every=st.integers(1, 24),
    weight_b=st.sampled_from([1.0, 2.0, 4.0]),
)
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_stale_copies_keep_the_gap_within_what_they_had_not_heard(
    redis_server: RedisServer, seed: int, replicas: int, merge_every: int, weight_b: float
) -> None:
    gap, bound = asyncio.run(
        _gap_with_stale_copies(
            redis_server.url, seed, replicas, merge_every, {"a": 1.0, "b": weight_b}
        )
    )
    assert gap <= bound + 1e-6


def test_a_replica_that_stops_merging_stops_counting_as_waiting(
    redis_server: RedisServer,
) -> None:
    """Its tenants waiting there are backlogged for the others until its entry is
    older than the TTL: an arrival elsewhere is then lifted to nothing waiting."""

    async def run() -> None:
        def store(name: str) -> RedisCounterStore:
            return RedisCounterStore(
                redis_server.url, namespace="ttl", gateway_id=name, gateway_ttl_s=0.3,
                heartbeat_s=3600,
            )  # fmt: skip

        dead, alive = store("dead"), store("alive")
        await dead.start()
        await alive.start()
        try:
            await alive.arrive_and_take("b", (("b", 100.0),))
            await alive.sync()
            await dead.sync()
            await dead.arrive("a", ("a",))  # lifted to b's 100, the last admitted
            dead.charge((("a", 500.0),))
            await dead.sync()  # then it crashes: no more merges, its entry stays
            await alive.sync()
            assert alive.state.elsewhere == {"a": ("a",)}
            # c arrives where a waits elsewhere: lifted to a's 600.
            assert await alive.arrive("c", ("c",)) == 600.0
            await alive.leave("c")
            await asyncio.sleep(0.4)
            await alive.sync()
            assert alive.state.elsewhere == {}
            # Nothing waits anywhere: d is lifted to the last admitted (b's 100) only.
            assert await alive.arrive("d", ("d",)) == 100.0
        finally:
            await alive.close()
            dead._closing = True  # crashed: no last merge
            await dead._redis.aclose()

    asyncio.run(run())


def _merged_when_told(url: str, namespace: str) -> RedisCounterStore:
    """A store that merges only when the test says, with the usual 1 s heartbeat (an
    unchanged waiting entry is then not rewritten) and a TTL no test outlasts."""
    return RedisCounterStore(
        url, namespace=namespace, gateway_id="g0", heartbeat_s=1.0, gateway_ttl_s=60.0,
        flush_interval_s=3600.0, sync_every=10**9,
    )  # fmt: skip


def test_a_merge_reads_the_hash_once_and_writes_only_what_changed(
    redis_server: RedisServer,
) -> None:
    """However many requests a merge carries: the script, TIME, one HGETALL, and one
    HSET when something changed (a charge, a lift, the waiting entry, the last
    admitted); nothing written when nothing did."""
    import redis

    async def run() -> None:
        store = _merged_when_told(redis_server.url, "cost")
        await store.start()
        try:
            await store.arrive("a", ("a",))
            await store.arrive("b", ("b",))
            for _ in range(10):
                await store.arrive_and_take("c", (("c", 10.0),))
            await store.pick([("a", (("a", 5.0),)), ("b", (("b", 5.0),))])
            redis.Redis.from_url(redis_server.url).config_resetstat()
            await store.sync()  # eleven charges, a waiting entry, the last admitted
            assert commands_run(redis_server.url) == {
                "evalsha": 1,
                "time": 1,
                "hgetall": 1,
                "hset": 1,
            }
            redis.Redis.from_url(redis_server.url).config_resetstat()
            await store.sync()  # nothing changed here since
            assert commands_run(redis_server.url) == {"evalsha": 1, "time": 1, "hgetall": 1}
        finally:
            await store.close()

    asyncio.run(run())


def test_a_waiting_entry_dropped_by_another_replica_is_written_again(
    redis_server: RedisServer,
) -> None:
    """An unchanged entry is not rewritten at every merge; one that another replica
    dropped (it took this one for dead: a pause longer than the TTL) is, at the next."""
    import redis

    client = redis.Redis.from_url(redis_server.url)

    async def run() -> None:
        store = _merged_when_told(redis_server.url, "gone")
        await store.start()
        try:
            await store.arrive("a", ("a",))
            await store.sync()
            assert client.hexists("gone:vtc", "~w:g0")
            client.hdel("gone:vtc", "~w:g0")
            await store.sync()  # unchanged here: not rewritten, but Redis said it is gone
            await store.sync()
            assert client.hget("gone:vtc", "~w:g0").endswith(b"\na")
        finally:
            await store.close()

    asyncio.run(run())
