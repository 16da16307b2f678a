"""What the gateway can reach: each upstream's health endpoint and its Redis (at the top
level: it asks of two rooms, upstreams/ and replicas/).

`tokenfair gateway --check` prints it after validating the config (exit status 1 when
something does not answer), and the gateway logs it as it starts, one line each, so an
operator sees at once which upstreams and which Redis it found. Each upstream is asked
with the gateway's own HTTP client (upstreams/client.py), within
`PROBE_TIMEOUT_S` in all.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from tokenfair.gateway.config import GatewayConfig, UpstreamConfig
from tokenfair.gateway.upstreams.client import PROBE_HEADERS, UpstreamClient, failure_name

PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Reach:
    what: str  # "upstream NAME (URL, models ...)" or "Redis URL"
    ok: bool
    detail: str  # "healthy", "answered 503", "ConnectionRefusedError" ...

    def line(self) -> str:
        return f"{self.what}: {self.detail}"


def _capacity(upstream: UpstreamConfig, shared: bool) -> str:
    parts = []
    if upstream.max_concurrent is not None:
        parts.append(f"max_concurrent {upstream.max_concurrent}")
    if upstream.max_inflight_tokens is not None:
        parts.append(f"max_inflight_tokens {upstream.max_inflight_tokens}")
    where = "shared by the replicas through Redis" if shared else "this replica's alone"
    return f"{', '.join(parts)}, {where}"


async def _upstream(upstream: UpstreamConfig, shared: bool) -> Reach:
    what = (
        f"upstream {upstream.name} ({upstream.url}, engine {upstream.engine}, "
        f"models {', '.join(upstream.models)}; "
        f"{_capacity(upstream, shared)})"
    )
    client = UpstreamClient(upstream.url, PROBE_HEADERS, connect_timeout_s=PROBE_TIMEOUT_S)
    try:
        status, _ = await client.get(upstream.health_path, PROBE_TIMEOUT_S)
    except OSError as error:  # UpstreamError, TimeoutError
        return Reach(what, False, f"unreachable ({failure_name(error)})")
    finally:
        await client.close()
    if status == 200:
        return Reach(what, True, "healthy")
    return Reach(what, False, f"{upstream.health_path} answered {status}")


async def _redis(config: GatewayConfig) -> Reach:
    assert config.redis is not None
    from redis.exceptions import RedisError

    from tokenfair.gateway.replicas.redis_client import connect

    r = config.redis
    what = f"Redis {r.url} (namespace {r.namespace!r})"
    client = connect(r.url, PROBE_TIMEOUT_S)
    try:
        await client.ping()
        return Reach(what, True, "answers")
    except (RedisError, OSError, TimeoutError) as error:
        return Reach(what, False, f"unreachable ({type(error).__name__})")
    finally:
        with contextlib.suppress(RedisError, OSError):
            await client.aclose()


async def probe(config: GatewayConfig) -> list[Reach]:
    """Every upstream and the Redis (if any), each asked once, together."""
    shared = config.redis is not None and config.redis.share_capacity
    checks = [_upstream(u, shared) for u in config.upstreams]
    if config.redis is not None:
        checks.append(_redis(config))
    return list(await asyncio.gather(*checks))
