"""Gateway replicas fail open when Redis fails: under load from tenants on different
replicas, with the default settings (shared counters and shared capacity), first
tokens keep going out while Redis is frozen (SIGSTOP) and while it is killed, beyond
gateway_ttl_s too (when each replica holds its share), the upstream's capacity holds,
and a gateway started while Redis is down serves."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from tests.gateway.load import Done, closed_loop
from tests.gateway.processes import fake_upstream, gateway, state, stats
from tests.gateway.redis_server import RedisServer, free_port

CAPACITY = 4
TTL_S = 1.0
OUTAGE_S = 3.0
LATE_S = 1.5  # into the outage: past gateway_ttl_s, each replica on its share


def load(urls: dict[str, str], seconds: float) -> list[Done]:
    """Each tenant floods its own replica for `seconds`; what completed."""

    async def run() -> list[Done]:
        t0 = time.perf_counter()
        done: list[Done] = []
        await asyncio.gather(
            *(
                closed_loop(url, tenant, 4, 8, t0 + seconds, t0, done)
                for tenant, url in urls.items()
            )
        )
        return done

    return asyncio.run(run())


def first_tokens(done: list[Done], tenant: str, after: float) -> int:
    """First tokens of `tenant`'s requests that went out `after` seconds into the load."""
    return sum(1 for d in done if d.tenant == tenant and d.start + d.first >= after)


def test_replicas_keep_dispatching_through_a_frozen_and_a_killed_redis(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    upstream = fake_upstream(tmp_path, "u", token_interval=0.005)
    config = [{"url": upstream.url, "models": ["fake"], "max_concurrent": CAPACITY}]
    settings = {"url": redis.url, "namespace": "open", "gateway_ttl_s": TTL_S}
    gws = [
        gateway(tmp_path, config, name=f"g{i}", redis=settings, gateway_id=f"g{i}")
        for i in range(2)
    ]
    urls = {"heavy": gws[0].url, "light": gws[1].url}
    try:
        warm = load(urls, 1.0)
        assert first_tokens(warm, "heavy", 0) and first_tokens(warm, "light", 0)
        assert stats(upstream)["peak_running"] <= CAPACITY  # Redis up: shared exactly
        assert redis.process is not None
        os.kill(redis.process.pid, signal.SIGSTOP)  # frozen: calls time out
        try:
            frozen = load(urls, OUTAGE_S)
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
        # Every tenant still gets out, past gateway_ttl_s too.
        assert first_tokens(frozen, "heavy", LATE_S) > 0, frozen
        assert first_tokens(frozen, "light", LATE_S) > 0, frozen
        assert all(d.output == 8 for d in frozen)  # nothing failed or hung for Redis
        redis.stop()  # killed: connections refused
        killed = load(urls, OUTAGE_S)
        assert first_tokens(killed, "heavy", LATE_S) > 0, killed
        assert first_tokens(killed, "light", LATE_S) > 0, killed
        assert all(d.output == 8 for d in killed)
        assert all(state(g)["degraded"] for g in gws)
        # Each replica within its share once gateway_ttl_s has passed; while one that
        # held more than its share finishes what it was running, the upstream may run
        # up to one share more (it queues what it cannot start).
        peak = stats(upstream)["peak_running"]
        assert peak <= CAPACITY + CAPACITY // 2
        redis.start()  # back, empty: fairness and capacity sharing resume
        deadline = time.monotonic() + 60  # a bound for a busy machine, not a speed
        while any(state(g)["degraded"] for g in gws):
            assert time.monotonic() < deadline, [state(g) for g in gws]
            load(urls, 0.3)
        print(
            "first tokens in a 3 s outage, all / after 1.5 s (heavy, light): frozen "
            f"{first_tokens(frozen, 'heavy', 0)}/{first_tokens(frozen, 'heavy', LATE_S)}, "
            f"{first_tokens(frozen, 'light', 0)}/{first_tokens(frozen, 'light', LATE_S)}; "
            f"killed {first_tokens(killed, 'heavy', 0)}/{first_tokens(killed, 'heavy', LATE_S)}, "
            f"{first_tokens(killed, 'light', 0)}/{first_tokens(killed, 'light', LATE_S)}; "
            f"the upstream's peak {peak}"
        )
    finally:
        for g in gws:
            g.stop()
        upstream.stop()
        redis.stop()


def test_a_gateway_started_while_redis_is_down_serves(tmp_path: Path) -> None:
    upstream = fake_upstream(tmp_path, "u", token_interval=0.001)
    config = [{"url": upstream.url, "models": ["fake"], "max_concurrent": CAPACITY}]
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    g = gateway(tmp_path, config, name="alone", redis={"url": nowhere, "namespace": "down"})
    try:
        done = load({"heavy": g.url}, 1.0)
        assert done and all(d.output == 8 for d in done)
    finally:
        g.stop()
        upstream.stop()
