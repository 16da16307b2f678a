"""Where VTC's counters live: the store interface and the in-memory store.

The gateway's dispatcher asks a store three questions, each answered at once:
`arrive` (a request of this tenant starts waiting: apply the lift rule), `pick` (of
these waiting tenants, which comes first? charge it), `leave` (a waiting request went
away). `arrive_and_take` is `arrive` then `pick` of that one request in a single step: a
request that finds nothing waiting and room upstream goes at once. Output tokens are
charged with `charge`.

Counters are per node of the tenants' group tree (hierarchical VTC, the core's
ledger): a tenant's `path` is its nodes from the top-level group down
to itself (`@org-a`, `@org-a/search`, `tenant`; just `tenant` without groups), and a
charge is a tuple of (node, amount) pairs along it, each amount already divided by that
node's weight. The lift applies at every level, and the pick descends the tree: among
the candidates, the top-level node with the smallest counter, then its child with the
smallest counter, down to a tenant (ties: the first candidate, the oldest head). A
flat tree is plain weighted VTC.

The rules run here only, through the core's ledger: a gateway alone keeps one
`LocalCounters`, and each of several replicas keeps one merged with the others' through
Redis (`redis_store.py`), where the tenants waiting at the other replicas count as
backlogged too (`wait_elsewhere`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenfair.core.policies.ledger import LIFT_RULES, Charge, CounterLedger

# A tenant's waiting request offered to `pick`: the tenant and what it would pay.
Candidate = tuple[str, Charge]
ROOT = ""


def path_of(charge: Charge) -> tuple[str, ...]:
    return tuple(node for node, _ in charge)


class CounterStore(Protocol):
    lift: str

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
    """VTC's counters in one process: the core's ledger, with waiting counts.

    The gateway offers `pick` the heads of its waiting tenants and charges the chosen
    one its whole request at once, already weighted (`Charge`); everything else (the
    lift, the descent, the counters per node) is the ledger's (core/policies/ledger.py).
    """

    def __init__(self, lift: str = "paper") -> None:
        if lift not in LIFT_RULES:
            raise ValueError(f"unknown lift rule {lift!r}")
        self.lift = lift
        self.ledger = CounterLedger(lift=lift)
        self.waiting: dict[str, int] = {}  # tenant -> requests waiting
        # tenant -> its path, for the tenants waiting at other replicas (Redis's store)
        self.elsewhere: dict[str, tuple[str, ...]] = {}

    @property
    def counter(self) -> dict[str, float]:
        """Every node's counter (a copy)."""
        return self.ledger.node_counters()

    def _backlogged(self, tenant: str) -> bool:
        return bool(self.waiting.get(tenant)) or tenant in self.elsewhere

    def wait_elsewhere(self, paths: dict[str, tuple[str, ...]]) -> None:
        """The tenants with requests waiting at the other replicas (and their paths),
        as Redis last said: backlogged here too, so that an arrival is lifted to them
        and a tenant waiting only elsewhere does not bank credit. Their counters come
        from Redis; they are filed without a lift."""
        ledger = self.ledger
        for tenant in self.elsewhere.keys() - paths.keys():
            del self.elsewhere[tenant]
            if not self.waiting.get(tenant):
                ledger.deactivate(tenant)
        for tenant, path in paths.items():
            if self._backlogged(tenant):
                self._place(tenant, path)
            else:
                if path != ledger.nodes(tenant):
                    ledger.set_path(tenant, path)
                ledger.activate(tenant, lift=False)
            self.elsewhere[tenant] = path

    def _place(self, tenant: str, path: tuple[str, ...] | None) -> None:
        ledger = self.ledger
        if not path or path == ledger.nodes(tenant):
            return
        # A tenants file reload moved it: it waits under its new groups from now on.
        waiting = self._backlogged(tenant)
        if waiting:
            ledger.deactivate(tenant)
        ledger.set_path(tenant, path)
        if waiting:
            ledger.activate(tenant, lift=False)

    def arrive(self, tenant: str, path: tuple[str, ...] | None = None) -> float:
        self._place(tenant, path)
        ledger = self.ledger
        if not self.waiting.get(tenant):
            if tenant not in self.elsewhere:
                ledger.activate(tenant, lift=True)
            self.waiting[tenant] = 1
        else:
            self.waiting[tenant] += 1
        return ledger.counter(tenant)

    def _one_less(self, tenant: str) -> None:
        left = self.waiting.get(tenant, 0) - 1
        if left > 0:
            self.waiting[tenant] = left
        elif self.waiting.pop(tenant, None) is not None and tenant not in self.elsewhere:
            self.ledger.deactivate(tenant)

    def leave(self, tenant: str) -> None:
        self._one_less(tenant)

    def pick(self, candidates: Sequence[Candidate]) -> Candidate:
        """The candidate the tree's descent chooses (ties: the first); charged."""
        if not candidates:
            raise ValueError("pick needs at least one candidate")
        for tenant, charge in candidates:
            self._place(tenant, path_of(charge))
        chosen = candidates[self.ledger.best_of([tenant for tenant, _ in candidates])]
        self._take(chosen[0], chosen[1])
        self._one_less(chosen[0])
        return chosen

    def _take(self, tenant: str, charge: Charge) -> None:
        self.ledger.admitted(tenant)
        self.ledger.apply(charge)

    def arrive_and_take(self, tenant: str, charge: Charge) -> float:
        """`arrive`, then `pick` with this tenant alone; returns its counter after."""
        self.arrive(tenant, path_of(charge))
        self.pick([(tenant, charge)])
        return self.ledger.counter(tenant)

    def charge(self, charge: Charge) -> None:
        self.ledger.apply(charge)


class MemoryCounterStore:
    """The store of a gateway without Redis: everything in this process, nothing lags."""

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
        return self.state.ledger.node_counters()

    @property
    def degraded(self) -> bool:
        return False
