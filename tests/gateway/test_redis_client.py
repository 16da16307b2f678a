"""The gateway's Redis pool: more callers than connections wait for one, never more
connections than its bound, and a caller that waits too long gets a ConnectionError
(which the stores take for an outage) rather than hanging."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.gateway.redis_server import RedisServer
from tokenfair.gateway.replicas.redis_client import QueueingConnectionPool


def _client(url: str, connections: int, wait_s: float):  # type: ignore[no-untyped-def]
    import redis.asyncio as aioredis

    pool = QueueingConnectionPool.from_url(url, max_connections=connections, wait_s=wait_s)
    return aioredis.Redis(connection_pool=pool)


def test_callers_beyond_the_bound_wait_for_a_connection(redis_server: RedisServer) -> None:
    async def run() -> tuple[list[object], int]:
        client = _client(redis_server.url, connections=2, wait_s=5.0)
        try:
            # Each call holds its connection 50 ms (BLPOP on an empty list times out).
            calls = [client.blpop([f"empty-{i}"], timeout=0.05) for i in range(12)]
            answers = await asyncio.gather(*calls)
            pool = client.connection_pool
            opened = len(pool._available_connections) + len(pool._in_use_connections)
            return answers, opened
        finally:
            await client.aclose()

    answers, opened = asyncio.run(run())
    assert answers == [None] * 12  # every call ran: none failed for want of a connection
    assert opened == 2


def test_a_caller_that_waits_too_long_gets_a_connection_error(
    redis_server: RedisServer,
) -> None:
    async def run() -> None:
        client = _client(redis_server.url, connections=1, wait_s=0.05)
        try:
            holder = asyncio.ensure_future(client.blpop(["empty"], timeout=1))
            await asyncio.sleep(0.1)  # the one connection is taken
            with pytest.raises(RedisConnectionError):
                await client.get("x")
            await holder
            assert await client.get("x") is None  # the connection came back
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_connection_that_fails_to_connect_gives_its_place_back_once() -> None:
    """redis-py releases a connection that fails to connect inside get_connection; the
    pool must count that place free once, not twice (or its bound would grow)."""
    from tests.gateway.redis_server import free_port

    async def run() -> int:
        client = _client(f"redis://127.0.0.1:{free_port()}/0", connections=2, wait_s=0.5)
        try:
            for _ in range(3):
                with pytest.raises(RedisConnectionError):
                    await client.get("x")
            return client.connection_pool._free._value  # type: ignore[no-any-return]
        finally:
            await client.aclose()

    assert asyncio.run(run()) == 2
