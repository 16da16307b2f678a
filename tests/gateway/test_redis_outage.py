"""The shared counters across a Redis outage: no decision waits for Redis, nothing
charged is lost (it errs towards charging), and the store recovers once.

A real redis-server, frozen (SIGSTOP), or stopped and started again on the same port,
with its data or empty, while the store's syncs are in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.gateway.redis_server import RedisServer
from tokenfair.gateway.replicas.redis_store import RedisCounterStore


async def _counter(url: str, namespace: str, node: str) -> float:
    client = aioredis.Redis.from_url(url)
    try:
        return float(await client.hget(f"{namespace}:vtc", node) or 0.0)
    finally:
        await client.aclose()


async def _until_recovered(store: RedisCounterStore) -> None:
    deadline = time.monotonic() + 60  # a generous bound for a busy machine, not a speed
    while store.degraded:
        assert time.monotonic() < deadline, "the store never reconciled"
        await asyncio.sleep(0.02)


def _at_once(coroutine: Any) -> Any:
    """Run a coroutine that must finish without waiting for anything: its value."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the call waited")


async def _shutdown_keeping_data(server: RedisServer) -> None:
    """Stop Redis as an operator's restart does: it saves its data and loads it again at
    the next start (the fixture's own stop loses everything)."""
    client = aioredis.Redis.from_url(server.url)
    with contextlib.suppress(RedisConnectionError):
        await client.shutdown(save=True)
    await client.aclose()
    assert server.process is not None
    server.process.wait(timeout=30)
    server.process = None


def test_no_decision_waits_for_a_frozen_redis(redis_server: RedisServer) -> None:
    """Redis frozen with a sync in flight: arrivals, picks, departures and charges are
    all decided on this replica's copy at once; once Redis thaws, they reach it."""

    async def run() -> None:
        store = RedisCounterStore(
            redis_server.url, namespace="frozen", gateway_id="g1", timeout_s=0.2,
            probe_interval_s=0.05, heartbeat_s=3600,
        )  # fmt: skip
        await store.start()
        try:
            redis_server.freeze()
            syncing = asyncio.ensure_future(store.sync())
            await asyncio.sleep(0)  # it waits on the frozen Redis
            assert _at_once(store.arrive("a", ("a",))) == 0.0
            assert _at_once(store.arrive("b", ("b",))) == 0.0
            assert _at_once(store.pick([("a", (("a", 10.0),)), ("b", (("b", 20.0),))])) == "a"
            assert _at_once(store.arrive_and_take("c", (("c", 5.0),))) == 5.0
            _at_once(store.leave("b"))
            store.charge((("a", 1.0),))
            await syncing
            assert store.degraded
            store.charge((("b", 2.0),))  # charged during the outage
            redis_server.thaw()
            await _until_recovered(store)
            await store.sync()  # what was charged while the recovering sync was out
            assert {n: await _counter(redis_server.url, "frozen", n) for n in "abc"} == {
                "a": 11.0,
                "b": 2.0,
                "c": 5.0,
            }
        finally:
            redis_server.thaw()
            await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("keep_data", [True, False], ids=["restarted", "restarted-empty"])
def test_what_was_charged_through_an_outage_is_all_counted(
    redis_server: RedisServer, keep_data: bool
) -> None:
    """Charges made before, during and after Redis goes away, at two replicas: once it
    is back (with its data, or empty), each counter holds no less than both served."""

    async def run() -> None:
        store = RedisCounterStore(
            redis_server.url, namespace="owe", gateway_id="g1", probe_interval_s=0.05,
            heartbeat_s=3600,
        )  # fmt: skip
        other = RedisCounterStore(redis_server.url, namespace="owe", gateway_id="g2")
        await store.start()
        try:
            await store.arrive_and_take("a", (("a", 100.0),))
            await store.sync()
            await other.start()
            other.charge((("a", 5000.0),))
            await other.close()  # merged: Redis holds 5100, and so does this copy next
            await store.sync()
            store.charge((("a", 10.0),))  # not merged yet when Redis goes away
            if keep_data:
                await _shutdown_keeping_data(redis_server)
            else:
                redis_server.stop()
            await store.sync()  # fails
            assert store.degraded
            store.charge((("a", 80.0),))  # charged during the outage
            redis_server.start()
            await _until_recovered(store)
            await store.sync()
            served = 100.0 + 5000 + 10 + 80
            assert await _counter(redis_server.url, "owe", "a") >= served
            assert store.counters()["a"] >= served
        finally:
            await store.close()

    asyncio.run(run())


def test_the_store_recovers_once_and_stays_recovered(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Pooled connections from before the outage are dead when Redis returns; syncs
    made on them afterwards must not start another outage. The outage is one warning;
    the recovery one line at INFO (news, not a problem)."""

    async def run() -> None:
        store = RedisCounterStore(
            redis_server.url, namespace="flap", gateway_id="g1", probe_interval_s=0.05
        )
        await store.start()
        try:
            # Many syncs at once: the pool holds that many connections afterwards.
            for i in range(24):
                await store.arrive(f"t{i}", (f"t{i}",))
            await asyncio.gather(*(store.sync() for _ in range(8)))
            redis_server.stop()
            await asyncio.gather(*(store.sync() for _ in range(4)))
            assert store.degraded and store.outages == 1
            redis_server.start()
            await _until_recovered(store)
            for _ in range(3):
                for i in range(24):
                    await store.leave(f"t{i}")
                    await store.arrive(f"t{i}", (f"t{i}",))
                await asyncio.gather(*(store.sync() for _ in range(8)))
            assert not store.degraded
            assert store.outages == 1
        finally:
            await store.close()

    with caplog.at_level(logging.INFO, logger="tokenfair.gateway"):
        asyncio.run(run())
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, text in said if "is unreachable" in text] == [logging.WARNING]
    assert [level for level, text in said if "answers again:" in text] == [logging.INFO]
