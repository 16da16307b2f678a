"""VTC's counters shared by the gateway replicas through Redis, off the request path.

Each replica decides on its own copy of the counters (`LocalCounters`, the core's
ledger): an arrival's lift, the pick among its waiting tenants, a request that goes at
once, each costs no round trip. In the background, one script (`lua.SYNC`) merges the
copy with Redis: it adds what this replica charged and lifted since its last sync,
records which tenants wait here, and brings back every counter, the tenants waiting at
the other live replicas (backlogged here too, for the lift) and the node admitted last
under each group anywhere (the paper's lift when nothing waits).

A replica syncs after `sync_every` dispatches (16), no sooner than `flush_interval_s`
(50 ms) after its last sync, and at least every `heartbeat_s` (1 s). So the counters it
decides with miss at most what the other replicas charged since their last sync and
since its own: the staleness bound of docs/deploy.md, which the property tests of
tests/gateway/test_shared_counters.py check on random workloads.

If Redis fails (refused, timed out, frozen), nothing waits for it: the replica keeps
deciding on its copy, keeps what it changed, and sends it all with the first sync that
succeeds. A sync that failed after Redis applied it is sent again, which errs towards
charging, never away from it. Counters Redis lost (it restarted empty) are written
back from this copy: no counter drops below what a replica saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from tokenfair.edge.tasks import cancel_and_wait
from tokenfair.gateway.replicas import lua
from tokenfair.gateway.replicas.counters import Candidate, Charge, LocalCounters, path_of
from tokenfair.gateway.replicas.redis_client import connect, failure

log = logging.getLogger("tokenfair.gateway")

_FAILURES = (RedisError, OSError, asyncio.TimeoutError)
_NOTHING_TO_WRITE = "-"  # the waiting entry, when it was empty at the last sync too


class RedisCounterStore:
    """The counters of one band, decided here and merged with Redis (module doc)."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "tokenfair",
        gateway_id: str | None = None,
        lift: str = "paper",
        timeout_s: float = 0.25,
        flush_interval_s: float = 0.05,
        heartbeat_s: float = 1.0,
        gateway_ttl_s: float = 5.0,
        sync_every: int = 16,
        probe_interval_s: float = 0.5,
    ) -> None:
        self.url = url
        self.lift = lift
        self.namespace = namespace
        self.gateway_id = gateway_id or uuid.uuid4().hex[:12]
        self.flush_interval_s = flush_interval_s
        self.heartbeat_s = heartbeat_s
        self.ttl_ms = int(gateway_ttl_s * 1000)
        self.sync_every = sync_every
        self.probe_interval_s = probe_interval_s
        self.state = LocalCounters(lift)
        self._redis = connect(url, timeout_s)
        self._script = self._redis.register_script(lua.SYNC)
        # What this replica changed since its last sync was sent.
        self._charges: dict[str, float] = {}  # node -> amount to add
        self._floors: dict[str, float] = {}  # node -> lifted to at least this, before them
        self._last: tuple[str, ...] | None = None  # the path of the tenant admitted last
        self._dispatches = 0
        self._heard_last: dict[str, str] = {}  # group -> its child admitted last, in Redis
        self._epoch: str | None = None  # of Redis's counters, at the last sync
        self._entry_sent = True  # Redis may hold a waiting entry of this replica
        self._entry_written, self._entry_written_at = "", 0.0  # its lines, and when
        self._synced_at = 0.0
        self._due = asyncio.Event()
        self._syncing = asyncio.Lock()  # one sync at a time: answers settle in order
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.degraded = False
        self.outages = 0
        self.syncs = 0

    # --- lifecycle ---
    async def start(self) -> None:
        await self.sync()
        self._tasks = [asyncio.create_task(self._loop())]

    async def close(self) -> None:
        self._closing = True  # also: the last sync takes this replica's waiting entry out
        await cancel_and_wait(self._tasks)
        with contextlib.suppress(*_FAILURES):
            await self.sync()
        with contextlib.suppress(*_FAILURES):
            await self._redis.aclose()

    async def _loop(self) -> None:
        # The flag as well as the cancel: a cancel that lands inside a Redis call can
        # be lost there, and the loop must still end.
        while not self._closing:
            if self.degraded:
                interval = self.probe_interval_s
            elif self._dispatches >= self.sync_every:
                interval = self.flush_interval_s
            else:
                interval = self.heartbeat_s
            wait = self._synced_at + interval - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._due.wait()
                self._due.clear()
                continue  # what is due may have changed: look again
            try:
                await self.sync()
            except Exception:  # a bug must not stop the syncs (the others would then
                # take this replica for dead while it still decides)
                log.exception("shared counters: the sync failed")
                self._synced_at = time.monotonic()

    # --- one sync ---
    async def sync(self) -> None:
        async with self._syncing:
            await self._sync_once()

    def _waiting_entry(self) -> str:
        ledger = self.state.ledger
        lines = "" if self._closing else "\n".join(
            "\t".join(ledger.nodes(tenant)) for tenant in self.state.waiting
        )  # fmt: skip
        if not lines and not self._entry_sent:
            return _NOTHING_TO_WRITE
        # The same tenants as Redis has: rewritten only to keep the entry's time (the
        # replica's liveness) well within the TTL.
        fresh = time.monotonic() - self._entry_written_at + self.heartbeat_s < self.ttl_ms / 2000
        if lines and lines == self._entry_written and fresh:
            return _NOTHING_TO_WRITE
        return lines

    def _last_news(self, last: tuple[str, ...] | None) -> str:
        """The tenant admitted last here, for Redis; '' when Redis had it already."""
        if last is None:
            return ""
        parents = ("", *last[:-1])
        if all(self._heard_last.get(p) == node for p, node in zip(parents, last, strict=True)):
            return ""
        return "\t".join(last)

    async def _sync_once(self) -> None:
        charges, self._charges = self._charges, {}
        floors, self._floors = self._floors, {}
        last, self._last = self._last, None
        dispatches, self._dispatches = self._dispatches, 0
        entry = self._waiting_entry()
        nodes = charges.keys() | floors.keys()
        args: list[Any] = [self.namespace, self.gateway_id, self.ttl_ms, len(nodes)]
        for node in nodes:
            floor = floors.get(node)
            args.extend((node, "" if floor is None else repr(floor), repr(charges.get(node, 0.0))))
        args.extend((entry, self._last_news(last)))
        self._synced_at = time.monotonic()
        try:
            answer = await self._script(args=args)
        except _FAILURES as error:
            self._keep(charges, floors, last, dispatches)
            self._entry_sent = True  # unknown: take it out at the next sync if need be
            self._entry_written = ""  # and write it again
            self._failed(error)
            return
        self.syncs += 1
        if entry != _NOTHING_TO_WRITE:
            self._entry_sent = bool(entry)
            self._entry_written, self._entry_written_at = entry, self._synced_at
        merged = lua.read_answer(answer, self.gateway_id)
        if not merged.entry_kept:  # dropped by another replica (this one seemed dead)
            self._entry_written = ""
        if self.degraded:
            self.degraded = False
            log.info("Redis at %s answers again: counters merged", self.url)
        self._settle(merged)

    def _keep(
        self,
        charges: dict[str, float],
        floors: dict[str, float],
        last: tuple[str, ...] | None,
        dispatches: int,
    ) -> None:
        """A sync failed: what it carried goes with the next one (it may have reached
        Redis before the failure: sending it again errs towards charging)."""
        for node, amount in charges.items():
            self._charges[node] = self._charges.get(node, 0.0) + amount
        for node, floor in floors.items():
            self._floors[node] = max(floor, self._floors.get(node, floor))
        if self._last is None:
            self._last = last
        self._dispatches += dispatches

    def _failed(self, error: BaseException) -> None:
        if self.degraded:
            return
        self.degraded = True
        self.outages += 1
        self._due.set()  # the loop probes sooner than it planned
        log.warning(
            "Redis at %s %s: deciding on this replica's counters until it answers again",
            self.url,
            failure(error),
        )

    def _settle(self, merged: lua.Merged) -> None:
        """This copy becomes Redis's counters plus what changed here since the sync
        was sent; a counter Redis does not have is kept, and written back next time."""
        ledger = self.state.ledger
        shared = merged.counters
        if self._epoch is not None and merged.epoch != self._epoch:
            self._lost(shared)
        self._epoch = merged.epoch
        lowered: set[str] = set()
        for node, value in shared.items():
            target = max(value, self._floors.get(node, value)) + self._charges.get(node, 0.0)
            current = ledger.counter(node)
            if target != current:
                ledger.apply(((node, target - current),))
                if target < current:
                    lowered.add(node)
        for node, value in ledger.node_counters().items():
            if node not in shared:  # Redis lost it (restarted empty), or never had it
                seen = value - self._charges.get(node, 0.0)
                if seen:  # (Redis reads a counter it lacks as 0)
                    self._floors[node] = max(seen, self._floors.get(node, seen))
        if lowered:  # a refund elsewhere: file the backlogged tenants' entries afresh
            for tenant in {*self.state.waiting, *self.state.elsewhere}:
                if lowered.intersection(ledger.nodes(tenant)):
                    ledger.refile(tenant)
        self.state.wait_elsewhere(merged.elsewhere)
        if self._last is None:  # nothing admitted here since: Redis's are the latest
            for parent, node in merged.last_children.items():
                if self._heard_last.get(parent) != node:
                    ledger.admitted_elsewhere(parent, node)
        self._heard_last = merged.last_children

    def _lost(self, shared: dict[str, float]) -> None:
        """Redis lost its counters (it restarted empty) since the last sync: this copy's
        are written back with the next sync, as floors (none ends below what a replica
        saw), and kept until then."""
        pending = self._charges
        for node, value in self.state.ledger.node_counters().items():
            kept = max(shared.get(node, 0.0), value - pending.get(node, 0.0))
            shared[node] = kept
            self._floors[node] = max(kept, self._floors.get(node, kept))
        self._entry_written = ""  # the waiting entry went with them: write it again
        self._due.set()
        log.warning("Redis at %s lost the shared counters: writing back this replica's", self.url)

    # --- what changed here ---
    def _charged(self, charge: Charge) -> None:
        pending = self._charges
        for node, amount in charge:
            if amount:
                pending[node] = pending.get(node, 0.0) + amount

    def _lifted(self, nodes: tuple[str, ...], before: list[float]) -> None:
        ledger, pending = self.state.ledger, self._charges
        for node, was in zip(nodes, before, strict=True):
            now = ledger.counter(node)
            if now > was:  # in Redis's terms: before the charges not yet sent
                floor = now - pending.get(node, 0.0)
                self._floors[node] = max(floor, self._floors.get(node, floor))

    def _admitted(self, tenant: str) -> None:
        self._last = self.state.ledger.nodes(tenant)
        self._dispatches += 1
        if self._dispatches >= self.sync_every:
            self._due.set()

    def _arrive(self, tenant: str, path: tuple[str, ...]) -> float:
        nodes = path or (tenant,)
        ledger = self.state.ledger
        before = [ledger.counter(node) for node in nodes]
        counter = self.state.arrive(tenant, path)
        self._lifted(nodes, before)
        return counter

    # --- the store interface: no call waits for Redis ---
    async def arrive(self, tenant: str, path: tuple[str, ...]) -> float:
        return self._arrive(tenant, path)

    async def leave(self, tenant: str) -> None:
        self.state.leave(tenant)

    async def pick(self, candidates: Sequence[Candidate]) -> str:
        tenant, charge = self.state.pick(candidates)
        self._charged(charge)
        self._admitted(tenant)
        return tenant

    async def arrive_and_take(self, tenant: str, charge: Charge) -> float:
        self._arrive(tenant, path_of(charge))
        self.state.pick([(tenant, charge)])
        self._charged(charge)
        self._admitted(tenant)
        return self.state.ledger.counter(tenant)

    def charge(self, charge: Charge) -> None:
        self.state.charge(charge)
        self._charged(charge)

    def counters(self) -> dict[str, float]:
        return self.state.counter
