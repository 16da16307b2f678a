"""Where VTC's counters live: the store interface and the in-memory store.

The gateway's dispatcher asks a store three questions, each answered atomically:
`arrive` (a request of this tenant starts waiting: apply the lift rule), `pick` (of
these waiting tenants, which comes first? charge it), `leave` (a waiting request went
away). `arrive_and_take` is `arrive` then `pick` of that one request in a single step: a
request that finds nothing waiting and room upstream goes at once, with one round trip
to Redis instead of two. Output tokens are charged with `charge`, which may be buffered
and is flushed with the next question or within a flush interval.

Counters are per node of the tenants' group tree (hierarchical VTC, the core's
`HierarchicalVTCPolicy`): a tenant's `path` is its nodes from the top-level group down
to itself (`@org-a`, `@org-a/search`, `tenant`; just `tenant` without groups), and a
charge is a tuple of (node, amount) pairs along it, each amount already divided by that
node's weight. The lift applies at every level, and the pick descends the tree: among
the candidates, the top-level node with the smallest counter, then its child with the
smallest counter, down to a tenant (ties: the first candidate, the oldest head). A
flat tree is plain weighted VTC.

The same rules run in Python here (one gateway, or a gateway that lost Redis) and in
Lua in Redis (`lua.py`, several gateways), so both keep SPEC section 3's counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# (node, amount) pairs from the top-level group down to the tenant.
Charge = tuple[tuple[str, float], ...]
# A tenant's waiting request offered to `pick`: the tenant and what it would pay.
Candidate = tuple[str, Charge]
ROOT = ""


def path_of(charge: Charge) -> tuple[str, ...]:
    return tuple(node for node, _ in charge)


class CounterStore(Protocol):
    lift: str
    remote: bool  # answers need a round trip (Redis); False: in this process, at once

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def arrive(self, tenant: str, path: tuple[str, ...]) -> float: ...
    async def leave(self, tenant: str) -> None: ...
    async def pick(self, candidates: Sequence[Candidate]) -> str: ...
    async def arrive_and_take(self, tenant: str, charge: Charge) -> float: ...
    def charge(self, charge: Charge) -> None: ...
    def counters(self) -> dict[str, float]: ...
    @property
    def degraded(self) -> bool: ...


class LocalCounters:
    """VTC's counters, waiting counts and last-admitted children in one process."""

    def __init__(self, lift: str = "paper") -> None:
        if lift not in ("paper", "artifact", "none"):
            raise ValueError(f"unknown lift rule {lift!r}")
        self.lift = lift
        self.counter: dict[str, float] = {}  # node -> counter
        self.waiting: dict[str, int] = {}  # tenant -> requests waiting
        self.paths: dict[str, tuple[str, ...]] = {}  # tenant -> its path, when grouped
        self.last: dict[str, str] = {}  # parent (ROOT for the top) -> child admitted last

    def _backlogged(self) -> dict[str, set[str]]:
        """parent -> its children with a waiting request below them."""
        found: dict[str, set[str]] = {}
        for tenant, n in self.waiting.items():
            if n > 0:
                parent = ROOT
                for node in self.paths.get(tenant, (tenant,)):
                    found.setdefault(parent, set()).add(node)
                    parent = node
        return found

    def arrive(self, tenant: str, path: tuple[str, ...] | None = None) -> float:
        path = path or (tenant,)
        if len(path) > 1:
            self.paths[tenant] = path
        elif not self.paths:  # no groups: flat VTC's lift, without the tree walk
            return self._arrive_flat(tenant)
        counter = self.counter
        if self.lift != "none" and not self.waiting.get(tenant):
            backlogged = self._backlogged()
            parent = ROOT
            for node in path:
                siblings = backlogged.get(parent)
                if siblings is None or node not in siblings:
                    c = counter.get(node, 0.0)
                    floor: float | None = None
                    if siblings:
                        floor = min(counter.get(s, 0.0) for s in siblings)
                    elif self.lift == "paper" and parent in self.last:
                        floor = counter.get(self.last[parent], 0.0)
                    counter[node] = floor if floor is not None and floor > c else c
                parent = node
        for node in path:
            counter.setdefault(node, 0.0)
        self.waiting[tenant] = self.waiting.get(tenant, 0) + 1
        return counter[tenant]

    def _arrive_flat(self, tenant: str) -> float:
        c = self.counter.get(tenant, 0.0)
        if self.lift != "none" and not self.waiting.get(tenant):
            others = [self.counter.get(t, 0.0) for t, n in self.waiting.items() if n > 0]
            floor: float | None = min(others) if others else None
            if floor is None and self.lift == "paper" and ROOT in self.last:
                floor = self.counter.get(self.last[ROOT], 0.0)
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

    def pick(self, candidates: Sequence[Candidate]) -> Candidate:
        """The candidate the tree's descent chooses (ties: the first); charged."""
        if not candidates:
            raise ValueError("pick needs at least one candidate")
        counter = self.counter
        if len(candidates) == 1:
            chosen = candidates[0]
            self._take(chosen[0], chosen[1])
            self._one_less(chosen[0])
            return chosen
        remaining = list(candidates)
        depth = 0
        while True:
            best: str | None = None
            for _, charge in remaining:
                node = charge[depth][0]
                if best is None or counter.get(node, 0.0) < counter.get(best, 0.0):
                    best = node
            remaining = [c for c in remaining if c[1][depth][0] == best]
            if len(remaining[0][1]) == depth + 1:  # best is a tenant
                break
            depth += 1
        chosen = remaining[0]
        self._take(chosen[0], chosen[1])
        self._one_less(chosen[0])
        return chosen

    def _take(self, tenant: str, charge: Charge) -> None:
        parent = ROOT
        for node, amount in charge:
            self.counter[node] = self.counter.get(node, 0.0) + amount
            self.last[parent] = node
            parent = node

    def arrive_and_take(self, tenant: str, charge: Charge) -> float:
        """`arrive`, then `pick` with this tenant alone; returns its counter after."""
        self.arrive(tenant, path_of(charge))
        self.pick([(tenant, charge)])
        return self.counter[tenant]

    def charge(self, charge: Charge) -> None:
        for node, amount in charge:
            self.counter[node] = self.counter.get(node, 0.0) + amount


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

    async def arrive(self, tenant: str, path: tuple[str, ...]) -> float:
        return self.state.arrive(tenant, path)

    async def leave(self, tenant: str) -> None:
        self.state.leave(tenant)

    async def pick(self, candidates: Sequence[Candidate]) -> str:
        return self.state.pick(candidates)[0]

    async def arrive_and_take(self, tenant: str, charge: Charge) -> float:
        return self.state.arrive_and_take(tenant, charge)

    def charge(self, charge: Charge) -> None:
        self.state.charge(charge)

    def counters(self) -> dict[str, float]:
        return dict(self.state.counter)

    @property
    def degraded(self) -> bool:
        return False
