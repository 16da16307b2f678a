"""Where VTC's counters live: the store interface and the in-memory store.

The gateway's dispatcher asks a store three questions, each answered atomically:
`arrive` (a request of this tenant starts waiting: apply the lift rule), `pick` (of
these waiting tenants, which has the smallest counter? charge it), `leave` (a waiting
request went away). `arrive_and_take` is `arrive` then `pick` of that one request in a
single step: a request that finds nothing waiting and room upstream goes at once, with
one round trip to Redis instead of two. Output tokens are charged with `charge`, which may be buffered and
is flushed with the next question or within a flush interval.

The same rules run in Python here (one gateway, or a gateway that lost Redis) and in
Lua in Redis (`lua.py`, several gateways), so both keep SPEC section 3's counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class CounterStore(Protocol):
    lift: str
    remote: bool  # answers need a round trip (Redis); False: in this process, at once

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def arrive(self, tenant: str) -> float: ...
    async def leave(self, tenant: str) -> None: ...
    async def pick(self, candidates: Sequence[tuple[str, float]]) -> str: ...
    async def arrive_and_take(self, tenant: str, charge: float) -> float: ...
    def charge(self, tenant: str, amount: float) -> None: ...
    def counters(self) -> dict[str, float]: ...
    @property
    def degraded(self) -> bool: ...


class LocalCounters:
    """VTC's counters, waiting counts and last-admitted tenant in one process."""

    def __init__(self, lift: str = "paper") -> None:
        if lift not in ("paper", "artifact", "none"):
            raise ValueError(f"unknown lift rule {lift!r}")
        self.lift = lift
        self.counter: dict[str, float] = {}
        self.waiting: dict[str, int] = {}
        self.last: str | None = None

    def arrive(self, tenant: str) -> float:
        c = self.counter.get(tenant, 0.0)
        if self.lift != "none" and not self.waiting.get(tenant):
            others = [self.counter.get(t, 0.0) for t, n in self.waiting.items() if n > 0]
            floor: float | None = min(others) if others else None
            if floor is None and self.lift == "paper" and self.last is not None:
                floor = self.counter.get(self.last, 0.0)
            if floor is not None and floor > c:
                c = floor
        self.counter[tenant] = c
        self.waiting[tenant] = self.waiting.get(tenant, 0) + 1
        return c

    def _one_less(self, tenant: str) -> None:
        left = self.waiting.get(tenant, 0) - 1
        if left > 0:
            self.waiting[tenant] = left
        else:
            self.waiting.pop(tenant, None)

    def leave(self, tenant: str) -> None:
        self._one_less(tenant)

    def pick(self, candidates: Sequence[tuple[str, float]]) -> tuple[str, float]:
        """The candidate with the smallest counter (ties: the first), and its charge."""
        if not candidates:
            raise ValueError("pick needs at least one candidate")
        counter = self.counter
        best, charge = min(candidates, key=lambda item: counter.get(item[0], 0.0))
        counter[best] = counter.get(best, 0.0) + charge
        self._one_less(best)
        self.last = best
        return best, charge

    def arrive_and_take(self, tenant: str, charge: float) -> float:
        """`arrive`, then `pick` with this tenant alone; returns its counter after."""
        self.arrive(tenant)
        self.pick([(tenant, charge)])
        return self.counter[tenant]

    def charge(self, tenant: str, amount: float) -> None:
        self.counter[tenant] = self.counter.get(tenant, 0.0) + amount


class MemoryCounterStore:
    """The store of a gateway without Redis: everything in this process, nothing lags."""

    remote = False

    def __init__(self, lift: str = "paper") -> None:
        self.lift = lift
        self.state = LocalCounters(lift)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def arrive(self, tenant: str) -> float:
        return self.state.arrive(tenant)

    async def leave(self, tenant: str) -> None:
        self.state.leave(tenant)

    async def pick(self, candidates: Sequence[tuple[str, float]]) -> str:
        return self.state.pick(candidates)[0]

    async def arrive_and_take(self, tenant: str, charge: float) -> float:
        return self.state.arrive_and_take(tenant, charge)

    def charge(self, tenant: str, amount: float) -> None:
        self.state.charge(tenant, amount)

    def counters(self) -> dict[str, float]:
        return dict(self.state.counter)

    @property
    def degraded(self) -> bool:
        return False
