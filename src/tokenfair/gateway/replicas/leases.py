"""An upstream's capacity shared by the gateway replicas: leases held in Redis.

`max_concurrent` and `max_inflight_tokens` are the upstream's, however many gateway
replicas send to it. With `redis:` set (and `share_capacity`, the default), each
replica holds a lease on part of each upstream's capacity and dispatches within it on
its own, with no round trip per request; one Lua script (`SYNC`, lease_script.py, which
says how an upstream is divided) settles all of a replica's leases atomically, so the
leases of the live replicas never add up to more than an upstream's capacity. Redis
always holds at least a replica's lease: a lease shrinks only here, as what runs ends,
and Redis hears of it at the next sync. A replica syncs just after each period begins
(`heartbeat_s`, Redis's clock), when it gives capacity back, when a request waits and
its lease may grow, and when another replica's announcement names it; a lease granted
it by another replica's sync arrives in the announcement. A replica whose last sync is
older than `gateway_ttl_s` is dead: its capacity returns to the pool.

Redis unreachable (down, frozen, or not yet up when the gateway starts), the replica
fails open: it stops giving back, and after `RAISE_AFTER_S` (0.5 s) a lease below its
share (the capacity over the live replicas it last saw) is raised to it and none is
lowered, so it dispatches again within a second; the upstream may meanwhile be sent up
to the raised shares more than its capacity, for at most `gateway_ttl_s`. Once the
outage has lasted `gateway_ttl_s` (`STARTUP_GRACE_S` if it never reached Redis), each
lease becomes exactly its share. The first sync that succeeds grows no lease (what Redis
holds of the others may be gone), and settles every lease again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from tokenfair.edge.tasks import cancel_and_wait
from tokenfair.gateway.replicas.lease_outage import fail_open
from tokenfair.gateway.replicas.lease_script import SYNC, announced, claim_text
from tokenfair.gateway.replicas.redis_client import connect, failure, subscriber
from tokenfair.gateway.upstreams.capacity import Lease, ModelDemand
from tokenfair.gateway.upstreams.pool import Upstream

log = logging.getLogger("tokenfair.gateway")

_FAILURES = (RedisError, OSError, asyncio.TimeoutError)

# How long a replica that has not reached Redis since it started waits before it takes
# its share alone: long enough for a slow first answer, short enough that a gateway
# started with Redis down serves within a second or so.
STARTUP_GRACE_S = 1.0
# How long an outage lasts before a lease below this replica's share is raised to it.
RAISE_AFTER_S = 0.5
# How soon a lost subscription to the announcements is made again.
LISTEN_AGAIN_S = 0.5
# A periodic sync goes this long after a period begins (Redis's clock), so that every
# replica's lands in the new period.
PERIOD_MARGIN_S = 0.01


Demand = Callable[[], dict[str, ModelDemand]]


@dataclass(slots=True)
class _Want:
    upstream: Upstream
    slots: int  # what it would hold: what runs and what waits
    tokens: int
    # What it may use while the sync is in flight, which Redis must keep for it: its
    # lease here (never less than what runs; module doc).
    floor_slots: int
    floor_tokens: int


def _capacity(limit: int | None) -> int:
    return limit or 0  # 0: no such limit


class CapacityLeases:
    def __init__(
        self,
        url: str,
        upstreams: list[Upstream],
        demand: Demand,
        on_grant: Callable[[], None],
        *,
        namespace: str,
        gateway_id: str,
        timeout_s: float = 0.25,
        idle_interval_s: float = 1.0,
        ttl_s: float = 5.0,
    ) -> None:
        self.url = url
        self.upstreams = upstreams
        self.demand = demand
        self.on_grant = on_grant  # capacity appeared: wake the dispatcher
        self.namespace = namespace
        self.gateway_id = gateway_id
        self.idle_interval_s = idle_interval_s
        self.ttl_s = ttl_s
        self._redis = connect(url, timeout_s)
        self._listener = subscriber(url, timeout_s)
        self._channel = f"{namespace}:leases"
        self._sync = self._redis.register_script(SYNC)
        self._by_model: dict[str, list[Upstream]] = {}
        self._by_url = {upstream.url: upstream for upstream in upstreams}
        for upstream in upstreams:
            upstream.lease = Lease(on_give_back=self._gave_back)
            for model in upstream.config.models:
                self._by_model.setdefault(model, []).append(upstream)
        self._models = sorted(self._by_model)
        self._claimed: set[str] = set()  # the models this replica claimed at its last sync
        self._live = 1  # live replicas at the last sync, this one included
        # Redis's clock at the last sync, and this process's then: the periods' starts.
        self._redis_now_ms: int | None = None
        self._heard_at = 0.0
        self._synced = False  # a sync succeeded since the start
        self._failing_since: float | None = None  # the first failed sync of an outage
        self._announce = False  # capacity went back since the last sync: publish it
        self._nudged: asyncio.Event | None = None
        # One sync at a time: two in flight could settle out of order, and the older
        # answer would leave a lease here that Redis no longer holds for this replica.
        self._syncing = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.degraded = False

    # --- lifecycle ---
    async def start(self) -> None:
        self._nudged = asyncio.Event()
        await self.sync()
        self._tasks = [asyncio.create_task(self._loop()), asyncio.create_task(self._listen())]

    async def close(self) -> None:
        # The flag as well as the cancel: a cancel that lands inside a Redis call can
        # be lost there, and the loop must still end.
        self._closing = True
        await cancel_and_wait(self._tasks)
        # Give everything back at once rather than after the TTL (a restart, a scale-in).
        none = [_Want(u, 0, 0, 0, 0) for u in self.upstreams]
        async with self._syncing:
            with contextlib.suppress(*_FAILURES):
                await self._sync(args=self._args(none, {}, announce=True, leaving=True))
        for client in (self._redis, self._listener):
            with contextlib.suppress(*_FAILURES):
                await client.aclose()

    async def _listen(self) -> None:
        """Another replica's sync named this one (lease_script.py): apply the lease it
        granted here, or sync at once."""
        while not self._closing:
            pubsub = self._listener.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                async for message in pubsub.listen():
                    data = message.get("data")
                    if isinstance(data, bytes):
                        try:
                            self._announced(data.decode())
                        except Exception:  # a bug must not stop the listening
                            log.exception("upstream capacity leases: an announcement failed")
            except _FAILURES:  # Redis away: the syncs notice it; listen again soon
                await asyncio.sleep(min(self.idle_interval_s, LISTEN_AGAIN_S))
            finally:
                with contextlib.suppress(*_FAILURES):
                    await pubsub.aclose()

    def _announced(self, text: str) -> None:
        """A lease granted in Redis by another replica's sync is applied here when no
        sync of this replica is in flight (its answer could be about to lower it) and
        the grant is newer than this replica's last sync (which may have lowered it
        since); otherwise this replica syncs, and hears of it so."""
        at, granted = announced(text, self.gateway_id)
        applies = not self._syncing.locked() and (self._redis_now_ms or 0) < at
        grew = False
        for url, slots, tokens in granted:
            lease = self._by_url[url].lease if url in self._by_url else None
            if lease is None or not applies or (slots is None and tokens is None):
                if self._nudged is not None:
                    self._nudged.set()
                continue
            grew = lease.grant(slots, tokens) or grew
        if grew:
            self.on_grant()

    def _gave_back(self) -> None:
        self._announce = True
        if self._nudged is not None:
            self._nudged.set()

    async def _loop(self) -> None:
        assert self._nudged is not None
        while not self._closing:
            # Just after each period begins (the shares' turns: every replica syncs
            # then, and they agree on who is due what), and at once when capacity is
            # given back here, another replica's sync names this one, or a new claim is
            # made: never per request.
            interval = self._until_next_period()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can lose a cancel
            # that comes as the event is set (a replica closing as a peer announces).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._nudged.wait()
            self._nudged.clear()
            try:
                await self.sync()
            except Exception:  # a bug must not stop the leases (the others would
                # then take this replica for dead while it still sends)
                log.exception("upstream capacity leases: the sync failed")

    def _until_next_period(self) -> float:
        period = self.idle_interval_s
        if self._redis_now_ms is None:
            return period
        now_ms = self._redis_now_ms + 1000 * (time.monotonic() - self._heard_at)
        left = period - (now_ms / 1000) % period
        return left + PERIOD_MARGIN_S

    def nudge(self, model: str) -> None:
        """A request for `model` waits here: sync now if the other replicas have not
        heard that this one wants it, or if one of its upstreams may grow this replica's
        lease: it holds less than its due and the capacity looks free, or no other
        replica holds any of it (nobody else waits: what frees is ours)."""
        if self._nudged is None or self._nudged.is_set():
            return
        if model not in self._claimed:
            self._nudged.set()
            return
        for upstream in self._by_model.get(model, ()):
            lease = upstream.lease
            assert lease is not None
            cap = upstream.config
            slots_free = (
                cap.max_concurrent is None or lease.slots + lease.others_slots < cap.max_concurrent
            )
            tokens_free = (
                cap.max_inflight_tokens is None
                or lease.tokens + lease.others_tokens < cap.max_inflight_tokens
            )
            owed = lease.slots < lease.keep_slots or lease.tokens < lease.keep_tokens
            alone = not lease.others_slots and not lease.others_tokens
            if slots_free and tokens_free and (owed or alone):
                self._nudged.set()
                return

    # --- one sync ---
    def _wants(self, demand: dict[str, ModelDemand]) -> list[_Want]:
        """Per upstream: what this replica would hold there (what runs, and what waits
        for its models), and its lease, which Redis keeps for it (`_Want`)."""
        wants: list[_Want] = []
        for upstream in self.upstreams:
            lease = upstream.lease
            assert lease is not None
            needs = [demand[m] for m in upstream.config.models if m in demand]
            running, inflight = max(0, upstream.running), max(0, upstream.inflight_tokens)
            slots = running + sum(d.seats for d in needs)
            tokens = inflight + sum(d.tokens for d in needs)
            floor_slots, floor_tokens = max(lease.slots, running), max(lease.tokens, inflight)
            wants.append(_Want(upstream, slots, tokens, floor_slots, floor_tokens))
        return wants

    def _claim(self, model: str, need: ModelDemand) -> str:
        """What this replica's requests waiting for `model` ask (lease_script.py)."""
        assert need.claim is not None
        upstreams = self._by_model.get(model, ())
        slots = need.seats + sum(max(0, u.running) for u in upstreams)
        tokens = need.tokens + sum(max(0, u.inflight_tokens) for u in upstreams)
        return claim_text(need.claim[0], slots, tokens, need.nodes)

    def _args(
        self,
        wants: list[_Want],
        demand: dict[str, ModelDemand],
        announce: bool,
        leaving: bool = False,
    ) -> list[Any]:
        args: list[Any] = [
            self.namespace,
            self.gateway_id,
            int(self.ttl_s * 1000),
            # 2: leaving; 3: the first sync after an outage, which grows no lease (what
            # Redis holds of the others may be gone; they write theirs back as this one
            # does); 1: capacity was given back.
            2 if leaving else 3 if self.degraded else 1 if announce else 0,
            max(1, int(self.idle_interval_s * 1000)),
            len(wants),
        ]
        for want in wants:
            upstream, cap = want.upstream, want.upstream.config
            args.extend(
                (
                    upstream.url,
                    _capacity(cap.max_concurrent),
                    _capacity(cap.max_inflight_tokens),
                    want.slots,
                    want.tokens,
                    want.floor_slots,
                    want.floor_tokens,
                    len(cap.models),
                    *cap.models,
                )
            )
        args.append(len(self._models))
        for model in self._models:
            need = demand.get(model)
            args.extend(
                (model, "" if need is None or need.claim is None else self._claim(model, need))
            )
        return args

    async def sync(self) -> None:
        """Settle this replica's leases with Redis now (after any sync in flight)."""
        async with self._syncing:
            await self._sync_once()

    async def _sync_once(self) -> None:
        demand = self.demand()
        self._claimed = {m for m, d in demand.items() if d.claim is not None}
        wants = self._wants(demand)
        announce, self._announce = self._announce, False
        began = time.monotonic()
        try:
            answer = await self._sync(args=self._args(wants, demand, announce))
        except _FAILURES as error:
            self._failed(error, began)
            return
        self._synced, self._failing_since = True, None
        if self.degraded:
            self.degraded = False
            log.info("Redis at %s answers again: upstream capacity leases settled", self.url)
        self._settle(wants, answer)

    def _settle(self, wants: list[_Want], answer: list[Any]) -> None:
        grew = False
        for i, want in enumerate(wants):
            lease = want.upstream.lease
            assert lease is not None
            slots, others_slots, tokens, others_tokens, keep_slots, keep_tokens = (
                int(v) for v in answer[6 * i : 6 * i + 6]
            )
            # A limit the upstream does not have is no lease: nothing to hold, nothing
            # to give back (the script answers what would run there).
            if want.upstream.config.max_concurrent is None:
                slots = others_slots = keep_slots = 0
            if want.upstream.config.max_inflight_tokens is None:
                tokens = others_tokens = keep_tokens = 0
            # Given back during the sync (a request ended): Redis keeps more than that
            # until the next sync, which the give-back asked for.
            if lease.slots < want.floor_slots:
                slots = min(slots, lease.slots)
            if lease.tokens < want.floor_tokens:
                tokens = min(tokens, lease.tokens)
            upstream = want.upstream
            grew = lease.settle(
                (slots, tokens), (others_slots, others_tokens), (keep_slots, keep_tokens),
                upstream.running, upstream.inflight_tokens,
            ) or grew  # fmt: skip
        self._live = max(1, int(answer[6 * len(wants)]))
        self._redis_now_ms, self._heard_at = int(answer[6 * len(wants) + 1]), time.monotonic()
        if grew:
            self.on_grant()

    def _failed(self, error: BaseException, began: float) -> None:
        """A sync begun at `began` failed: the outage dates from then."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = began
        if not self.degraded:
            self.degraded = True
            log.warning(
                "Redis at %s %s: upstream leases below this replica's share of its "
                "upstream (its capacity over %d live replica(s)) are raised to it, and "
                "after %g s each becomes exactly that share, until Redis answers",
                self.url,
                failure(error),
                self._live,
                self.ttl_s if self._synced else min(self.ttl_s, STARTUP_GRACE_S),
            )
        grace = self.ttl_s if self._synced else min(self.ttl_s, STARTUP_GRACE_S)
        lasted = now - self._failing_since
        if fail_open(self.upstreams, self._live, lasted, grace, RAISE_AFTER_S):
            self.on_grant()
