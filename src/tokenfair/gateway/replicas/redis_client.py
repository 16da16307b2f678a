"""The gateway's Redis connections: short timeouts, one retry on a broken connection,
health checks on idle ones, and a pool that queues instead of failing when busy.

- A pooled connection can be dead without knowing it (Redis restarted, a firewall
  forgot it): one idle for longer than `HEALTH_CHECK_S` is pinged before use, and a
  command that finds its connection broken is sent once more on a new one. Without
  this, the first calls after an outage land on the dead connections of before and
  the gateway flaps between "unreachable" and "reconciled".
- Only a broken connection is retried, at once: a timeout is not (the script may have
  run; the caller counts its charges again locally, erring towards charging), and
  neither is a refused connection after that one retry. redis-py's own default, ten
  retries with backoff, would hold a request for seconds while Redis is away.
- More callers than connections wait for one (up to the command timeout) rather than
  get "too many connections", which would read as an outage. redis-py's own
  BlockingConnectionPool does that with a condition and a timer on every call, some 8%
  of a gateway's short requests/s; the pool here waits only when all connections are
  in use (a semaphore's free path costs next to nothing).
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

HEALTH_CHECK_S = 5.0
MAX_CONNECTIONS = 64


class QueueingConnectionPool(aioredis.ConnectionPool):
    """redis-py's pool, where a caller finding every connection in use waits up to
    `wait_s` for one to come back (then ConnectionError, as a failed connect)."""

    def __init__(self, *, wait_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wait_s = wait_s
        self._free = asyncio.Semaphore(self.max_connections)
        # Connections handed out, each holding a place of `_free`. (redis-py releases a
        # connection that fails to connect inside get_connection itself: that one was
        # never handed out, and its place is given back once, here.)
        self._held: set[Any] = set()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._free.locked():
            try:
                async with asyncio.timeout(self.wait_s):
                    await self._free.acquire()
            except TimeoutError:
                raise RedisConnectionError("no Redis connection came free in time") from None
        else:
            await self._free.acquire()  # free: returns at once
        try:
            connection = await super().get_connection(*args, **kwargs)
        except BaseException:
            self._free.release()
            raise
        self._held.add(connection)
        return connection

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)
        finally:
            if connection in self._held:
                self._held.discard(connection)
                self._free.release()


def connect(url: str, timeout_s: float) -> Any:
    """A client of the Redis at `url` (redis://, rediss:// or unix://)."""
    pool = QueueingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        wait_s=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=HEALTH_CHECK_S,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
    return aioredis.Redis(connection_pool=pool)


def subscriber(url: str, timeout_s: float) -> Any:
    """A client for a pub/sub subscription: it waits for messages as long as it takes
    (no read timeout), and reconnects as the others do."""
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        health_check_interval=HEALTH_CHECK_S,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )


def failure(error: BaseException) -> str:
    """What went wrong with Redis, for a log line: unreachable, or an answer that was an
    error (a script Redis refused, a read-only replica, memory full), which a user must
    see in full rather than take for an outage."""
    if isinstance(error, ResponseError):
        return f"answers with an error ({error})"
    return f"is unreachable ({type(error).__name__})"
