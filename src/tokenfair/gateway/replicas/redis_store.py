"""VTC's counters in Redis, shared by every gateway replica, with a local fallback.

Each question to the store is one Lua script (`lua.py`), so gateways in front of one
pool keep one fairness order. Output charges are buffered in this process and travel
with the next script, or within `flush_interval_s`.

If Redis fails (refused, timed out), the gateway never fails a request for it: it logs
one warning and carries on with local counters seeded from the last values Redis gave,
recording what it charges. A background task probes Redis; when it answers, the local
charges are added to Redis's counters (and no counter drops below what this gateway
saw, which re-seeds a Redis that came back empty), this gateway's waiting counts are
written back, and the shared counters are used again.

An outage errs towards charging, never away from it: every charge a failed call
carried is counted locally and added at reconciliation, even when Redis may have
applied it before the call failed, and whichever call fails first or last. A call that
fails for an outage that is already over (it began before the reconciliation) is sent
again rather than starting another outage, so the store recovers once per outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from tokenfair.edge.tasks import cancel_and_wait
from tokenfair.gateway.replicas import lua
from tokenfair.gateway.replicas.counters import Candidate, Charge, LocalCounters, path_of
from tokenfair.gateway.replicas.redis_client import connect

log = logging.getLogger("tokenfair.gateway")

_FAILURES = (RedisError, OSError, asyncio.TimeoutError)
# The scripts that change a gateway's waiting hash.
_CHANGE_WAITING = frozenset(("ARRIVE", "ARRIVE_TAKE", "PICK", "LEAVE"))


def _flat(pairs: dict[str, float] | dict[str, int]) -> list[Any]:
    out: list[Any] = []
    for key, value in pairs.items():
        out.extend((key, repr(value) if isinstance(value, float) else value))
    return out


def _as_counters(flat: list[Any]) -> dict[str, float]:
    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return {text(flat[i]): float(text(flat[i + 1])) for i in range(0, len(flat), 2)}


class RedisCounterStore:
    remote = True

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
        probe_interval_s: float = 0.5,
    ) -> None:
        self.url = url
        self.lift = lift
        self.namespace = namespace
        self.gateway_id = gateway_id or uuid.uuid4().hex[:12]
        self.flush_interval_s = flush_interval_s
        self.heartbeat_s = heartbeat_s
        self.ttl_ms = int(gateway_ttl_s * 1000)
        self.probe_interval_s = probe_interval_s
        self._redis = connect(url, timeout_s)
        self._scripts = {
            name: self._redis.register_script(getattr(lua, name))
            for name in (
                "ARRIVE",
                "ARRIVE_TAKE",
                "PICK",
                "LEAVE",
                "FLUSH",
                "HEARTBEAT",
                "RECONCILE",
            )
        }
        self._pending: dict[str, float] = {}  # charges not yet sent
        self._waiting: dict[str, int] = {}  # this gateway's waiting requests per tenant
        self._paths: dict[str, tuple[str, ...]] = {}  # grouped tenants' paths, for a fallback
        self._snapshot: dict[str, float] = {}  # the last counters Redis returned
        self._local: LocalCounters | None = None  # set while degraded
        self._outage: dict[str, float] = {}  # charged locally while degraded
        self._tasks: list[asyncio.Task[None]] = []
        self.outages = 0
        # Recoveries so far: a call that began before the last one and fails failed
        # for an outage that is over.
        self._generation = 0
        self._closing = False
        self._inflight = 0  # calls in flight that change this gateway's waiting hash

    # --- lifecycle ---
    async def start(self) -> None:
        await self._heartbeat()
        self._tasks = [
            asyncio.create_task(self._loop(self.flush_interval_s, self._flush)),
            asyncio.create_task(self._loop(self.heartbeat_s, self._heartbeat)),
        ]

    async def close(self) -> None:
        self._closing = True
        await cancel_and_wait(self._tasks)
        if self._local is None:
            with contextlib.suppress(*_FAILURES):
                await self._flush()
        with contextlib.suppress(*_FAILURES):
            await self._redis.aclose()

    async def _loop(self, interval: float, step: Any) -> None:
        # The flag as well as the cancel: a cancel that lands inside a Redis call can
        # be lost there, and the loop must still end.
        while not self._closing:
            await asyncio.sleep(interval)
            await step()

    @property
    def degraded(self) -> bool:
        return self._local is not None

    # --- the fallback ---
    def _degrade(self, error: BaseException, unsent: dict[str, float]) -> LocalCounters:
        local = LocalCounters(self.lift)
        local.restore(dict(self._snapshot), dict(self._waiting), dict(self._paths))
        self._local = local
        self._absorb(self._take_pending())
        self._absorb(unsent)
        self.outages += 1
        log.warning(
            "Redis at %s is unreachable (%s): using local counters until it answers again",
            self.url,
            type(error).__name__,
        )
        if not self._closing:
            self._tasks.append(asyncio.create_task(self._recover()))
        return local

    def _absorb(self, unsent: dict[str, float]) -> None:
        """Charges whose script failed while degraded: counted locally, and added to
        Redis at reconciliation. Some may have reached Redis before the call failed:
        counting them again errs towards charging."""
        assert self._local is not None
        for node, amount in unsent.items():
            self._local.charge(((node, amount),))
            self._outage[node] = self._outage.get(node, 0.0) + amount

    def _restore(self, unsent: dict[str, float]) -> None:
        """Charges of a call to send again with the next one."""
        for node, amount in unsent.items():
            self._pending[node] = self._pending.get(node, 0.0) + amount

    async def _remote(self, name: str, head: list[Any], tail: list[Any]) -> tuple[bool, Any]:
        """Run a script, with the buffered charges, while Redis is in use: (True, its
        answer), or (False, None) once the store is degraded (by this call or another),
        the charges it carried counted locally."""
        while self._local is None:
            generation = self._generation
            pending = self._take_pending()
            changes_waiting = name in _CHANGE_WAITING
            self._inflight += changes_waiting
            try:
                return True, await self._call(name, head, pending, tail)
            except _FAILURES as error:
                if self._local is not None:  # another call saw the outage first
                    self._absorb(pending)
                elif generation != self._generation:  # an outage already over: again
                    self._restore(pending)
                else:
                    self._degrade(error, pending)
            finally:
                self._inflight -= changes_waiting
        return False, None

    async def _recover(self) -> None:
        while self._local is not None and not self._closing:
            await asyncio.sleep(self.probe_interval_s)
            if self._inflight:  # a call from before the outage may still change waiting
                continue
            local = self._local
            outage, self._outage = self._outage, {}
            args: list[Any] = [self.namespace, self.gateway_id, len(local.counter)]
            for tenant, value in local.counter.items():
                args.extend((tenant, repr(outage.get(tenant, 0.0)), repr(value)))
            args.extend((len(self._waiting), *_flat(self._waiting)))
            try:
                await self._scripts["RECONCILE"](args=args)
            except _FAILURES:
                for tenant, amount in outage.items():
                    self._outage[tenant] = self._outage.get(tenant, 0.0) + amount
                continue
            # Charged while the reconcile was in flight: send them with the next call.
            for tenant, amount in self._outage.items():
                self._pending[tenant] = self._pending.get(tenant, 0.0) + amount
            self._outage = {}
            # self._waiting stays: it saw every arrival and departure, including those
            # whose Redis call succeeded after another had failed.
            self._local = None
            self._generation += 1
            log.info("Redis at %s answers again: counters reconciled", self.url)
            await self._heartbeat()

    async def heartbeat_now(self) -> None:
        """Flush charges and refresh the counters now (tests, shutdown)."""
        await self._heartbeat()

    # --- calls ---
    def _take_pending(self) -> dict[str, float]:
        pending, self._pending = self._pending, {}
        return pending

    async def _call(
        self, name: str, head: list[Any], pending: dict[str, float], tail: list[Any]
    ) -> Any:
        args: list[Any] = [
            self.namespace,
            self.gateway_id,
            *head,
            len(pending),
            *_flat(pending),
            *tail,
        ]
        return await self._scripts[name](args=args)

    async def _flush(self) -> None:
        if self._local is None and self._pending:
            await self._remote("FLUSH", [], [])

    async def _heartbeat(self) -> None:
        if self._local is not None:
            return
        waiting = [-1] if self._inflight else [len(self._waiting), *_flat(self._waiting)]
        ok, flat = await self._remote("HEARTBEAT", [], waiting)
        if ok:
            self._snapshot = _as_counters(flat)

    # --- the store interface ---
    async def arrive(self, tenant: str, path: tuple[str, ...]) -> float:
        if len(path) > 1:
            self._paths[tenant] = path
        tail = [tenant, self.lift, len(path), *path]
        ok, answer = await self._remote("ARRIVE", [self.ttl_ms], tail)
        if ok:
            value = float(answer)
            self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
            self._also_locally(tenant, +1)
            self._snapshot[tenant] = value
            return value
        assert self._local is not None
        self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        return self._local.arrive(tenant, path)

    def _one_less(self, tenant: str) -> None:
        _add(self._waiting, tenant, -1)

    def _also_locally(self, tenant: str, delta: int) -> None:
        """A Redis call that succeeded after another had failed (the store degraded
        while it was in flight): the local counters, in charge now, must see it too,
        or the tenant stays 'waiting' there, and in Redis after the reconcile."""
        if self._local is not None:
            _add(self._local.waiting, tenant, delta)

    async def leave(self, tenant: str) -> None:
        ok, _ = await self._remote("LEAVE", [], [tenant])
        if ok:
            self._one_less(tenant)
            self._also_locally(tenant, -1)
            return
        assert self._local is not None
        self._one_less(tenant)
        self._local.leave(tenant)

    async def pick(self, candidates: Sequence[Candidate]) -> str:
        if self._local is None:
            tail: list[Any] = [len(candidates)]
            for tenant, charge in candidates:
                tail.extend((tenant, len(charge)))
                for node, amount in charge:
                    tail.extend((node, repr(amount)))
            ok, answer = await self._remote("PICK", [], tail)
            if ok:
                best, value = answer
                name = best.decode() if isinstance(best, bytes) else str(best)
                self._snapshot[name] = float(value.decode() if isinstance(value, bytes) else value)
                for tenant, charge in candidates:
                    if tenant == name:  # the groups above it were charged too
                        self._note(charge, skip_last=True)
                        break
                self._one_less(name)
                self._also_locally(name, -1)
                return name
        assert self._local is not None
        name, charge = self._local.pick(candidates)
        self._record_outage(charge)
        self._one_less(name)
        return name

    def _note(self, charge: Charge, skip_last: bool = False) -> None:
        """What Redis now holds for the charged nodes, as far as this gateway knows."""
        nodes = charge[:-1] if skip_last else charge
        for node, amount in nodes:
            self._snapshot[node] = self._snapshot.get(node, 0.0) + amount

    def _record_outage(self, charge: Charge) -> None:
        for node, amount in charge:
            self._outage[node] = self._outage.get(node, 0.0) + amount

    async def arrive_and_take(self, tenant: str, charge: Charge) -> float:
        if len(charge) > 1:
            self._paths[tenant] = path_of(charge)
        if self._local is None:
            tail: list[Any] = [tenant, self.lift, len(charge)]
            for node, amount in charge:
                tail.extend((node, repr(amount)))
            ok, value = await self._remote("ARRIVE_TAKE", [self.ttl_ms], tail)
            if ok:
                counter = float(value.decode() if isinstance(value, bytes) else value)
                self._note(charge, skip_last=True)
                self._snapshot[tenant] = counter
                return counter
        assert self._local is not None
        counter = self._local.arrive_and_take(tenant, charge)
        self._record_outage(charge)
        return counter

    def charge(self, charge: Charge) -> None:
        if self._local is not None:
            self._local.charge(charge)
            self._record_outage(charge)
            return
        pending, snapshot = self._pending, self._snapshot
        for node, amount in charge:
            if amount:
                pending[node] = pending.get(node, 0.0) + amount
                snapshot[node] = snapshot.get(node, 0.0) + amount

    def counters(self) -> dict[str, float]:
        if self._local is not None:
            return dict(self._local.counter)
        return dict(self._snapshot)


def _add(counts: dict[str, int], tenant: str, delta: int) -> None:
    left = counts.get(tenant, 0) + delta
    if left > 0:
        counts[tenant] = left
    else:
        counts.pop(tenant, None)
