"""Seam 2: which tenant's request goes next inside a band.

- `CounterFairness`: VTC (vtc, wvtc, vtc-artifact, lcf), with counters per node of the
  tenants' group tree in a `CounterStore`, shared through Redis by the gateway
  replicas; one store per band, so each band is a VTC of its own;
- `PolicyFairness`: the core's ordering policies by name (fcfs, priority, sjf[:aging],
  rpm:N), or a user's `KeyedPolicy` (`mypkg.mod:MyPolicy`), local to each replica: the
  request first by the policy's sort key goes, `accept` may refuse it at arrival (as
  `rpm:N` does), and it is told when the request goes by the start rule every driver
  uses (core/policies/starts.py).

This seam is the one door to the counters: the dispatch charge goes with `pick` and
`take_now`, and what a request costs as it streams (flow/meter.py) with `charge`. None
of them waits for Redis (the replicas merge their counters in the background).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from tokenfair.core.policies import make_policy
from tokenfair.core.policies.base import KeyedPolicy, Policy
from tokenfair.core.policies.ledger import Charge
from tokenfair.core.policies.starts import Starts
from tokenfair.core.policies.view import PolicyRequest
from tokenfair.gateway.flow.order import OrderKey
from tokenfair.gateway.flow.ticket import Ticket
from tokenfair.gateway.replicas.counters import CounterStore, path_of


class Fairness(Protocol):
    def order_key(self, ticket: Ticket) -> tuple: ...
    def accept(self, ticket: Ticket) -> bool: ...
    async def arrive(self, ticket: Ticket) -> None: ...
    async def leave(self, ticket: Ticket) -> None: ...
    async def pick(self, heads: Sequence[Ticket]) -> Ticket: ...
    async def take_now(self, ticket: Ticket) -> None: ...
    async def refund(self, ticket: Ticket) -> None: ...
    def charge(self, charge: Charge) -> None: ...


class CounterFairness:
    """The tenant with the smallest counter (down the group tree) goes first."""

    def __init__(self, store: CounterStore, order: OrderKey) -> None:
        self.store = store
        self.order_key = order

    def accept(self, ticket: Ticket) -> bool:
        return True

    async def arrive(self, ticket: Ticket) -> None:
        await self.store.arrive(ticket.tenant, path_of(ticket.charge))

    async def leave(self, ticket: Ticket) -> None:
        await self.store.leave(ticket.tenant)

    async def pick(self, heads: Sequence[Ticket]) -> Ticket:
        tenant = await self.store.pick([(t.tenant, t.charge) for t in heads])
        return next(t for t in heads if t.tenant == tenant)

    async def take_now(self, ticket: Ticket) -> None:
        await self.store.arrive_and_take(ticket.tenant, ticket.charge)

    async def refund(self, ticket: Ticket) -> None:
        """It left while being picked: the pick already counted it out of waiting."""
        self.store.charge(tuple((node, -amount) for node, amount in ticket.charge))

    def charge(self, charge: Charge) -> None:
        """Service as it is served (or refunded), (node, weighted amount) down a tenant's
        path: buffered by the store, sent with its next question or flush."""
        self.store.charge(charge)


class PolicyFairness:
    """One of the core's ordering policies, used for its sort key and its `accept`."""

    def __init__(self, spec: str) -> None:
        policy: Policy = make_policy(spec)
        if not isinstance(policy, KeyedPolicy):
            raise ValueError(f"policy {spec!r} does not order by a key")
        self.policy = policy
        self.starts = Starts(policy)  # the one rule for telling a policy a request goes

    def _view(self, ticket: Ticket) -> PolicyRequest:
        if ticket.view is None:
            ticket.view = PolicyRequest(
                request_id=str(ticket.seq),
                client=ticket.tenant,
                input_tokens=max(1, ticket.tokens - ticket.max_tokens),
                arrival_s=ticket.arrival,
                max_tokens=max(1, ticket.max_tokens),
                priority=ticket.priority,
            )
        return ticket.view

    def order_key(self, ticket: Ticket) -> tuple:
        return (*self.policy.sort_key(self._view(ticket), 1), ticket.seq)

    def accept(self, ticket: Ticket) -> bool:
        return self.policy.accept(self._view(ticket), ticket.arrival)

    async def arrive(self, ticket: Ticket) -> None:
        return None

    async def leave(self, ticket: Ticket) -> None:
        return None

    async def pick(self, heads: Sequence[Ticket]) -> Ticket:
        chosen = min(heads, key=lambda t: t.key)
        self.starts.start(self._view(chosen), 0, time.monotonic())
        return chosen

    async def take_now(self, ticket: Ticket) -> None:
        await self.pick([ticket])

    async def refund(self, ticket: Ticket) -> None:
        return None

    def charge(self, charge: Charge) -> None:
        return None  # the ordering policies keep no counters
