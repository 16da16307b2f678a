"""The counter store across a Redis outage: it errs towards charging, and recovers once.

A real redis-server, stopped and started again on the same port (empty: no
persistence), with the store's own calls in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.gateway.redis_server import RedisServer
from tokenfair.gateway.replicas.redis_store import RedisCounterStore


async def _counter(url: str, namespace: str, node: str) -> float:
    client = aioredis.Redis.from_url(url)
    try:
        return float(await client.hget(f"{namespace}:counters", node) or 0.0)
    finally:
        await client.aclose()


async def _until_recovered(store: RedisCounterStore) -> None:
    deadline = time.monotonic() + 60  # a generous bound for a busy machine, not a speed
    while store.degraded:
        assert time.monotonic() < deadline, "the store never reconciled"
        await asyncio.sleep(0.02)


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


def test_charges_carried_by_failing_calls_are_all_counted(redis_server: RedisServer) -> None:
    """Output charges made while calls are in flight when Redis goes away: the call that
    degrades the store, the one that fails after it, those still buffered, and those
    made during the outage. Another gateway charged the same tenant before; when Redis
    is back, its counter must hold no less than both gateways served."""

    async def run() -> None:
        store = RedisCounterStore(
            redis_server.url, namespace="owe", gateway_id="g1", probe_interval_s=0.05,
            heartbeat_s=3600,
        )  # fmt: skip
        other = RedisCounterStore(redis_server.url, namespace="owe", gateway_id="g2")
        await store.start()
        try:
            await store.arrive_and_take("a", (("a", 100.0),))
            await other.start()
            other.charge((("a", 5000.0),))
            await other.close()  # flushed: Redis holds 5100
            await _shutdown_keeping_data(redis_server)
            store.charge((("a", 10.0),))
            first = asyncio.ensure_future(store.arrive("b", ("b",)))
            await asyncio.sleep(0)  # it has taken the 10 and waits on Redis
            store.charge((("a", 20.0),))
            second = asyncio.ensure_future(store.arrive("c", ("c",)))
            await asyncio.sleep(0)  # and this one the 20
            store.charge((("a", 40.0),))  # still buffered when they fail
            await asyncio.gather(first, second)
            assert store.degraded
            store.charge((("a", 80.0),))  # charged locally during the outage
            redis_server.start()  # with the saved data
            await _until_recovered(store)
            await store.heartbeat_now()
            served = 100.0 + 5000 + 10 + 20 + 40 + 80
            assert await _counter(redis_server.url, "owe", "a") >= served
        finally:
            await store.close()

    asyncio.run(run())


def test_the_store_recovers_once_and_stays_recovered(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Pooled connections from before the outage are dead when Redis returns; calls
    made on them after the reconciliation must not start another outage. The outage is
    one warning; the recovery one line at INFO (news, not a problem)."""

    async def run() -> None:
        store = RedisCounterStore(
            redis_server.url, namespace="flap", gateway_id="g1", probe_interval_s=0.05
        )
        await store.start()
        try:
            # Many calls at once: the pool holds that many connections afterwards.
            await asyncio.gather(*(store.arrive(f"t{i}", (f"t{i}",)) for i in range(24)))
            redis_server.stop()
            # Calls in flight when Redis goes away, failing one after the other.
            await asyncio.gather(*(store.leave(f"t{i}") for i in range(12)))
            assert store.degraded and store.outages == 1
            redis_server.start()
            await _until_recovered(store)
            for _ in range(3):
                await asyncio.gather(*(store.arrive(f"u{i}", (f"u{i}",)) for i in range(24)))
                await asyncio.gather(*(store.leave(f"u{i}") for i in range(24)))
                await store.heartbeat_now()
            assert not store.degraded
            assert store.outages == 1
        finally:
            await store.close()

    with caplog.at_level(logging.INFO, logger="tokenfair.gateway"):
        asyncio.run(run())
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, text in said if "is unreachable" in text] == [logging.WARNING]
    assert [level for level, text in said if "answers again:" in text] == [logging.INFO]
