"""Upstream capacity shared by gateway replicas through leases in a real Redis.

In one process: two ledgers stand for two replicas, each with its own view of the same
upstream (capacity 4 requests, 1,000 in-flight tokens) and a demand the test sets. Then
two gateway processes in front of one upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import pytest

from tests.gateway.load import Done, closed_loop
from tests.gateway.processes import fake_upstream, gateway, state, stats
from tests.gateway.redis_server import RedisServer, commands_run
from tokenfair.gateway.config import HealthConfig, UpstreamConfig
from tokenfair.gateway.replicas.leases import STARTUP_GRACE_S, CapacityLeases
from tokenfair.gateway.upstreams.capacity import ModelDemand
from tokenfair.gateway.upstreams.pool import Upstream, UpstreamPool

CAP = UpstreamConfig(
    url="http://10.0.0.1:8000", models=["m"], max_concurrent=4, max_inflight_tokens=1000
)


class Replica:
    def __init__(
        self, redis: RedisServer, name: str, ttl_s: float = 5.0, period_s: float = 1.0
    ) -> None:
        self.name = name
        self.upstream: Upstream = UpstreamPool([CAP], HealthConfig()).upstreams[0]
        self.demand: dict[str, ModelDemand] = {}
        self.ledger = CapacityLeases(
            redis.url,
            [self.upstream],
            lambda: self.demand,
            lambda: None,
            namespace="cap",
            gateway_id=name,
            ttl_s=ttl_s,
            idle_interval_s=period_s,
        )

    def wants(
        self, requests: int, counter: float, band: int = 0, weights: dict[str, float] | None = None
    ) -> None:
        """`requests` of 10 tokens waiting here, of tenants with these weights (one
        tenant of weight 1, named after the replica, by default)."""
        nodes = weights or {f"t-{self.name}": 1.0}
        self.demand = (
            {"m": ModelDemand(requests, 10 * requests, (band, counter), dict(nodes))}
            if requests
            else {}
        )

    @property
    def due(self) -> int:
        assert self.upstream.lease is not None
        return self.upstream.lease.keep_slots

    @property
    def slots(self) -> int:
        assert self.upstream.lease is not None
        return self.upstream.lease.slots

    def run(self, n: int) -> None:
        """Dispatch n requests of 10 tokens within the lease, as the admission loop does."""
        for _ in range(n):
            assert self.upstream.has_room(10)
            self.upstream.acquire(10)


def test_leases_never_exceed_the_capacity_and_follow_the_weights_waiting(
    redis_server: RedisServer,
) -> None:
    async def run() -> None:
        one, two = Replica(redis_server, "g1"), Replica(redis_server, "g2")
        await one.ledger.start()
        await two.ledger.start()
        try:
            one.wants(6, counter=50.0)
            await one.ledger.sync()
            assert one.slots == 4  # all of it: nobody else asked
            one.run(4)
            one.wants(2, counter=50.0)
            assert not one.upstream.has_room(10)  # the lease, not the upstream, is full
            two.wants(3, counter=10.0, weights={"b": 3.0})  # three times a's weight
            await two.ledger.sync()
            assert (two.slots, two.due) == (0, 3)  # due 3 of 4, and nothing is free yet
            await one.ledger.sync()  # one hears of it: it gives back down to its due
            assert one.upstream.lease is not None and one.upstream.lease.giving_back
            assert one.due == 1
            one.upstream.release(10)  # a request ends at one: the slot goes back
            assert not one.upstream.has_room(10)
            await one.ledger.sync()
            await two.ledger.sync()
            assert (one.slots, two.slots) == (3, 1)
            for _ in range(2):
                one.upstream.release(10)
            await one.ledger.sync()
            await two.ledger.sync()
            assert (one.slots, two.slots) == (1, 3)
            one.upstream.release(10)  # down to its due: it keeps what frees now
            assert one.slots == 1 and one.upstream.has_room(10)
            assert one.slots + two.slots <= 4
        finally:
            await one.ledger.close()
            await two.ledger.close()

    asyncio.run(run())


def test_a_share_s_fraction_of_a_slot_is_held_in_turns(redis_server: RedisServer) -> None:
    """Weights 1 and 4 over 4 slots: 0.8 and 3.2 slots. Period after period the first
    is due 1 slot or none, 0.8 on average, and the two always add up to 4."""

    async def run() -> None:
        period = 0.02
        one = Replica(redis_server, "f1", period_s=period)
        two = Replica(redis_server, "f2", period_s=period)
        one.wants(8, counter=0.0, weights={"light": 1.0})
        two.wants(8, counter=0.0, weights={"heavy": 4.0})
        await one.ledger.sync()
        await two.ledger.sync()
        dues: list[int] = []
        try:
            for _ in range(100):
                await one.ledger.sync()
                await two.ledger.sync()
                await one.ledger.sync()  # in the same period as two's, almost always
                dues.append(one.due)
                await asyncio.sleep(period)
        finally:
            await one.ledger.close()
            await two.ledger.close()
        assert set(dues) == {0, 1}
        assert sum(dues) / len(dues) == pytest.approx(0.8, abs=0.05)

    asyncio.run(run())


def test_a_dead_replica_s_lease_returns_and_a_closed_one_s_at_once(
    redis_server: RedisServer,
) -> None:
    async def run() -> None:
        dead = Replica(redis_server, "dead", ttl_s=0.3)
        alive = Replica(redis_server, "alive", ttl_s=0.3)
        await dead.ledger.sync()
        dead.wants(4, counter=0.0)
        await dead.ledger.sync()
        dead.run(4)  # then it stops syncing: killed
        alive.wants(4, counter=0.0)
        await alive.ledger.sync()
        assert alive.slots == 0
        deadline = time.monotonic() + 60  # a bound for a busy machine, not a speed
        while alive.slots < 4:
            assert time.monotonic() < deadline, "the dead replica's lease never came back"
            await asyncio.sleep(0.1)
            await alive.ledger.sync()
        await alive.ledger.close()  # gives its lease back at once
        late = Replica(redis_server, "late", ttl_s=0.3)
        late.wants(4, counter=0.0)
        await late.ledger.sync()
        assert late.slots == 4
        await late.ledger.close()
        await dead.ledger.close()

    asyncio.run(run())


def test_tokens_are_leased_like_requests(redis_server: RedisServer) -> None:
    async def run() -> None:
        one, two = Replica(redis_server, "t1"), Replica(redis_server, "t2")
        try:
            one.demand = {"m": ModelDemand(1, 900, (0, 0.0), {"a": 1.0})}
            await one.ledger.sync()
            assert one.upstream.lease is not None and two.upstream.lease is not None
            assert one.upstream.lease.tokens == 1000  # alone: all of it, in reserve
            two.demand = {"m": ModelDemand(1, 300, (0, 0.0), {"b": 1.0})}
            await two.ledger.sync()
            assert two.upstream.lease.tokens == 0  # nothing free yet
            await one.ledger.sync()  # hears two's claim: its due is half, no reserve
            await one.ledger.sync()  # and tells Redis what it gave back (it asked to)
            await two.ledger.sync()
            # Two needs 300 of its 500: the 200 it cannot use are one's.
            assert (one.upstream.lease.tokens, two.upstream.lease.tokens) == (700, 300)
            assert two.upstream.has_room(300) and not one.upstream.has_room(900)
        finally:
            await one.ledger.close()
            await two.ledger.close()

    asyncio.run(run())


def test_a_sync_answered_late_never_overwrites_a_later_one(redis_server: RedisServer) -> None:
    """Two syncs of one replica in flight, the first one's answer back last: the lease
    this replica acts on must never exceed what Redis holds for it, and they agree once
    the syncs are over."""

    async def run() -> None:
        gone = Replica(redis_server, "late0")
        await gone.ledger.sync()
        await gone.ledger.close()  # gave its lease back, but still counts as live
        one = Replica(redis_server, "late1")
        await one.ledger.sync()  # two live replicas: a reserve of 2 slots
        script = one.ledger._sync
        calls = 0

        async def first_answer_late(*args: object, **kwargs: object) -> object:
            nonlocal calls
            calls += 1
            answer = await script(*args, **kwargs)
            if calls == 1:
                await asyncio.sleep(0.2)  # the second sync's answer arrives meanwhile
            return answer

        one.ledger._sync = first_answer_late  # type: ignore[assignment]
        try:
            one.wants(4, counter=0.0)
            first = asyncio.create_task(one.ledger.sync())  # asks for 4
            await asyncio.sleep(0.05)
            one.wants(0, counter=0.0)  # then only for its reserve
            await asyncio.gather(first, one.ledger.sync())
            field = "s\tlate1\t" + CAP.url  # the lease of slots (lease_script.py)
            held = await one.ledger._redis.hget("cap:capacity", field)
            assert one.slots == 2 <= int(held or 0)  # Redis never holds less
            await one.ledger.sync()  # the one its give-back asked for
            held = await one.ledger._redis.hget("cap:capacity", field)
            assert one.slots == int(held or 0) == 2
        finally:
            await one.ledger.close()

    asyncio.run(run())


def test_capacity_given_back_reaches_the_replica_owed_it_without_its_own_sync(
    redis_server: RedisServer,
) -> None:
    """`one` holds the 4 slots, `two` is due 2: as `one`'s requests end, its sync grants
    the freed slots to `two` in Redis and announces them; `two` applies the
    announcement without a sync of its own (a handover costs one sync, not two), and
    an announcement older than its last sync is not applied (that sync may have
    lowered its lease since)."""
    import redis.asyncio as aioredis

    async def run() -> None:
        listener = aioredis.Redis.from_url(redis_server.url).pubsub()
        await listener.subscribe("cap:leases")
        one, two = Replica(redis_server, "a1"), Replica(redis_server, "a2")
        try:
            one.wants(6, counter=0.0)
            await one.ledger.sync()
            one.run(4)
            two.wants(4, counter=0.0)
            await two.ledger.sync()  # its claim
            await one.ledger.sync()  # one hears it: it gives back, down to its due of 2
            assert one.upstream.lease is not None and one.upstream.lease.giving_back
            for _ in range(2):
                one.upstream.release(10)
            await asyncio.sleep(0.01)  # Redis's clock (ms) past two's last sync
            await one.ledger.sync()  # what frees is granted to two, and announced
            held = await one.ledger._redis.hget("cap:capacity", "s\ta2\t" + CAP.url)
            assert int(held or 0) == 2 and two.slots == 0
            said: list[str] = []
            for _ in range(20):  # what was published so far (None: a subscription reply)
                message = await listener.get_message(True, timeout=0.05)
                if message is not None:
                    said.append(message["data"].decode())
            granted = [m for m in said if f"a2\t{CAP.url}\t2\t" in m]
            assert granted, said
            stale = "0" + granted[-1][granted[-1].index("\n") :]  # as old as can be
            two.ledger._announced(stale)
            assert two.slots == 0
            lease = two.upstream.lease
            assert lease is not None
            lease.keep_slots = 1  # as if its last sync had heard of a smaller due
            two.ledger._announced(granted[-1])
            # A grant is at most the due: it raises the due, and nothing goes back.
            assert (two.slots, two.due, lease.giving_back) == (2, 2, False)
            two.run(2)
            assert one.upstream.running + two.upstream.running == 4
        finally:
            await listener.aclose()
            await one.ledger.close()
            await two.ledger.close()

    asyncio.run(run())


def test_what_a_replica_dispatches_during_its_sync_is_never_leased_twice(
    redis_server: RedisServer,
) -> None:
    """`one` holds the 4 slots and runs 2; `two` claims half. While `one`'s sync is in
    flight (it will hear that its due is 2), it dispatches 2 more within its lease:
    Redis must keep all 4 for it, and `two` gets a slot only once one of them ends."""

    async def run() -> None:
        one, two = Replica(redis_server, "r1"), Replica(redis_server, "r2")
        try:
            one.wants(6, counter=0.0)
            await one.ledger.sync()
            one.run(2)
            two.wants(2, counter=0.0)
            await two.ledger.sync()
            assert two.slots == 0
            script = one.ledger._sync

            async def dispatching_meanwhile(*args: object, **kwargs: object) -> object:
                answer = await script(*args, **kwargs)
                one.run(2)  # the admission loop went on while the answer travelled
                return answer

            one.ledger._sync = dispatching_meanwhile  # type: ignore[assignment]
            await one.ledger.sync()
            one.ledger._sync = script  # type: ignore[assignment]
            await two.ledger.sync()
            assert one.upstream.running == 4 and two.slots == 0
            one.upstream.release(10)  # given back: two's now
            await one.ledger.sync()
            await two.ledger.sync()
            assert (one.slots, two.slots) == (3, 1)
        finally:
            await one.ledger.close()
            await two.ledger.close()

    asyncio.run(run())


@pytest.mark.slow
def test_two_gateway_processes_share_an_upstream_s_capacity(tmp_path: Path) -> None:
    """Two replicas over one Redis in front of one upstream of 4 slots, both flooded:
    the upstream never has more than 4 requests at once, every request completes, and
    when one replica is killed the other gets the whole capacity."""
    redis = RedisServer(tmp_path)
    redis.start()
    upstream = fake_upstream(tmp_path, "u", token_interval=0.005)
    config = [{"url": upstream.url, "models": ["fake"], "max_concurrent": 4}]
    redis_settings = {"url": redis.url, "namespace": "pool", "gateway_ttl_s": 2.0}
    gws = [
        gateway(tmp_path, config, name=f"g{i}", redis=redis_settings, gateway_id=f"g{i}")
        for i in range(2)
    ]
    try:

        async def flood(urls: list[str], seconds: float) -> list[Done]:
            t0 = time.perf_counter()
            done: list[Done] = []
            await asyncio.gather(
                *(closed_loop(url, "heavy", 6, 8, t0 + seconds, t0, done) for url in urls)
            )
            return done

        done = asyncio.run(flood([g.url for g in gws], 3.0))
        assert done and all(d.output == 8 for d in done)
        assert stats(upstream)["peak_running"] <= 4
        gws[1].kill()  # its lease comes back after gateway_ttl_s
        deadline = time.monotonic() + 60
        while state(gws[0])["upstreams"]["upstream-0"]["lease"]["slots"] < 4:
            assert time.monotonic() < deadline, state(gws[0])
            asyncio.run(flood([gws[0].url], 0.5))
        assert stats(upstream)["peak_running"] <= 4
    finally:
        for g in gws:
            g.stop()
        upstream.stop()
        redis.stop()


def test_with_redis_gone_every_replica_dispatches_within_its_share(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fail open: a replica that was giving its slots back (the other had the better
    claim) must not let its lease follow its running requests down to nothing while
    Redis is away. Within gateway_ttl_s it keeps what it holds; after it, each replica
    holds exactly its share. Each replica warns of the outage, and says at INFO that
    Redis answers again."""
    redis = RedisServer(tmp_path)
    redis.start()

    async def run() -> None:
        one, two = Replica(redis, "g1", ttl_s=0.3), Replica(redis, "g2", ttl_s=0.3)
        await one.ledger.start()
        await two.ledger.start()
        try:
            one.wants(6, counter=50.0)
            await one.ledger.sync()
            one.run(4)
            two.wants(3, counter=10.0)  # the better claim: one gives back what frees
            await two.ledger.sync()
            await one.ledger.sync()
            assert one.upstream.lease is not None and one.upstream.lease.giving_back
            redis.stop()
            one.upstream.release(10)  # a request ends as Redis goes
            await one.ledger.sync()
            await two.ledger.sync()
            assert one.ledger.degraded and two.ledger.degraded
            held = one.slots
            for _ in range(3):  # the rest end during the outage
                one.upstream.release(10)
                await one.ledger.sync()
            assert one.slots == held > 0  # no longer following its requests down
            assert not one.upstream.lease.giving_back
            await asyncio.sleep(0.4)  # past gateway_ttl_s
            await one.ledger.sync()
            await two.ledger.sync()
            assert (one.slots, two.slots) == (2, 2)  # the capacity over two live replicas
            one.run(2)
            two.run(2)  # both dispatch, and together within the capacity of 4
            assert not one.upstream.has_room(10) and not two.upstream.has_room(10)
            redis.start()  # an empty Redis: the next syncs settle the leases again
            for replica in (one, two):
                for _ in range(2):
                    replica.upstream.release(10)
            await one.ledger.sync()
            await two.ledger.sync()
            assert not one.ledger.degraded and not two.ledger.degraded
            assert one.slots + two.slots <= 4
        finally:
            await one.ledger.close()
            await two.ledger.close()
            redis.stop()

    with caplog.at_level(logging.INFO, logger="tokenfair.gateway"):
        asyncio.run(run())
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, text in said if "is unreachable" in text] == [logging.WARNING] * 2
    assert [level for level, text in said if "answers again:" in text] == [logging.INFO] * 2


def test_a_replica_holding_nothing_when_redis_freezes_dispatches_within_a_second(
    tmp_path: Path,
) -> None:
    """Redis hangs (SIGSTOP) while `one` holds the whole capacity and `two` nothing:
    `two` must not wait gateway_ttl_s (5 s) to dispatch. After RAISE_AFTER_S (0.5 s)
    of failed syncs its lease is its share, `one` keeps what it holds until gateway_ttl_s (the upstream over its
    capacity by at most `two`'s share meanwhile), and Redis answering again settles
    both within the capacity."""
    redis = RedisServer(tmp_path)
    redis.start()

    async def run() -> None:
        one, two = Replica(redis, "g1"), Replica(redis, "g2")  # gateway_ttl_s 5 s
        await one.ledger.start()
        await two.ledger.start()
        try:
            two.wants(0, counter=0.0)
            await two.ledger.sync()
            one.wants(6, counter=0.0)
            await one.ledger.sync()
            one.run(4)
            await two.ledger.sync()
            assert (one.slots, two.slots) == (4, 0)
            redis.freeze()
            two.wants(2, counter=0.0)
            # Each sync waits out the Redis timeout (0.25 s) and fails: by the end of
            # the second the outage has lasted RAISE_AFTER_S, whatever the machine's
            # pace (a slower machine only makes the outage longer). A third is slack.
            syncs = 0
            while two.slots == 0 and syncs < 3:
                await two.ledger.sync()
                syncs += 1
            await one.ledger.sync()
            assert two.slots == 2 and one.slots == 4  # raised to its share; none lowered
            two.run(2)
            redis.thaw()
            for replica in (one, two):
                for _ in range(2):
                    replica.upstream.release(10)
            await one.ledger.sync()
            await two.ledger.sync()
            await one.ledger.sync()
            assert not one.ledger.degraded and not two.ledger.degraded
            assert one.slots + two.slots <= 4
        finally:
            with contextlib.suppress(Exception):
                redis.thaw()
            await one.ledger.close()
            await two.ledger.close()
            redis.stop()

    asyncio.run(run())


def test_a_replica_started_while_redis_is_down_dispatches(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)  # never started

    async def run() -> None:
        alone = Replica(redis, "g1")
        alone.wants(3, counter=0.0)
        await alone.ledger.start()
        try:
            assert alone.ledger.degraded
            # A first answer may only be slow: nothing yet, then the whole capacity (no
            # replica seen) once the start-up grace has passed.
            assert alone.slots == 0
            await asyncio.sleep(STARTUP_GRACE_S)
            await alone.ledger.sync()
            assert alone.slots == 4
            alone.run(3)
        finally:
            await alone.ledger.close()

    asyncio.run(run())


def test_a_sync_that_changes_nothing_writes_only_its_time(redis_server: RedisServer) -> None:
    """A lease sync reads the capacity hash once and writes what changed in one HSET:
    with two replicas settled, another sync of each is the script, TIME, HGETALL and
    the HSET of its last sync's time, however many fields the hash holds."""
    import redis

    async def run() -> None:
        one, two = Replica(redis_server, "c1"), Replica(redis_server, "c2")
        await one.ledger.start()
        await two.ledger.start()
        try:
            one.wants(3, counter=0.0)
            two.wants(3, counter=0.0)
            for _ in range(2):
                await one.ledger.sync()
                await two.ledger.sync()
            assert (one.slots, two.slots) == (2, 2)
            client = redis.Redis.from_url(redis_server.url)
            client.config_resetstat()
            await one.ledger.sync()
            await two.ledger.sync()
            assert commands_run(redis_server.url) == {
                "evalsha": 2, "time": 2, "hgetall": 2, "hset": 2,
            }  # fmt: skip
        finally:
            await one.ledger.close()
            await two.ledger.close()

    asyncio.run(run())


def test_a_limit_the_upstream_lacks_is_never_given_back(redis_server: RedisServer) -> None:
    """An upstream without a token limit: the lease holds no tokens, and a replica whose
    demand shrinks has nothing to give back (no sync for it, no announcement)."""
    slots_only = UpstreamConfig(url="http://10.0.0.2:8000", models=["m"], max_concurrent=4)

    async def run() -> None:
        one = Replica(redis_server, "n1")
        one.upstream = UpstreamPool([slots_only], HealthConfig()).upstreams[0]
        one.ledger = CapacityLeases(
            redis_server.url, [one.upstream], lambda: one.demand, lambda: None,
            namespace="slots", gateway_id="n1",
        )  # fmt: skip
        try:
            one.wants(4, counter=0.0)
            await one.ledger.sync()
            one.run(4)
            one.wants(0, counter=0.0)  # nothing waits: the tokens it would hold shrink
            await one.ledger.sync()
            lease = one.upstream.lease
            assert lease is not None
            assert (lease.slots, lease.tokens, lease.giving_back) == (4, 0, False)
            one.upstream.release(10)
            assert not one.ledger._announce  # no give-back to tell Redis of
        finally:
            await one.ledger.close()

    asyncio.run(run())
