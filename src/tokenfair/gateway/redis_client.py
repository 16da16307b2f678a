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
  get "too many connections", which would read as an outage.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

HEALTH_CHECK_S = 5.0
MAX_CONNECTIONS = 64


def connect(url: str, timeout_s: float) -> Any:
    """A client of the Redis at `url` (redis://, rediss:// or unix://)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=timeout_s,  # waiting for a free connection
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
