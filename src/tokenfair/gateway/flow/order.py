"""Seam 3: the order of one tenant's own requests for one model.

`arrival` keeps them as they came; `priority` (the default) puts a lower `priority`
first, ties by arrival, as the server does under VTC: a tenant orders its own work, and
no priority moves it ahead of another tenant (that is the fairness seam's choice). The
core's ordering policies (fcfs, priority, sjf) order by their own sort key.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from tokenfair.gateway.flow.ticket import Ticket

OrderKey = Callable[[Ticket], tuple]


def by_arrival(ticket: Ticket) -> tuple:
    return (ticket.seq,)


def by_priority(ticket: Ticket) -> tuple:
    return (ticket.priority, ticket.seq)


ORDERS: dict[str, OrderKey] = {"arrival": by_arrival, "priority": by_priority}


class TicketQueue:
    """Tickets sorted by their key (unique: it ends with the arrival number)."""

    __slots__ = ("_keys", "_tickets")

    def __init__(self) -> None:
        self._keys: list[tuple] = []
        self._tickets: list[Ticket] = []

    def push(self, ticket: Ticket) -> None:
        keys = self._keys
        if not keys or keys[-1] <= ticket.key:  # the usual case: after everything
            keys.append(ticket.key)
            self._tickets.append(ticket)
        else:
            at = bisect.bisect_right(keys, ticket.key)
            keys.insert(at, ticket.key)
            self._tickets.insert(at, ticket)

    def head(self) -> Ticket:
        return self._tickets[0]

    def pop_head(self) -> Ticket:
        del self._keys[0]
        return self._tickets.pop(0)

    def remove(self, ticket: Ticket) -> bool:
        at = bisect.bisect_left(self._keys, ticket.key)
        if at < len(self._tickets) and self._tickets[at] is ticket:
            del self._keys[at]
            del self._tickets[at]
            return True
        return False

    def __len__(self) -> int:
        return len(self._tickets)

    def tokens(self) -> int:
        """The in-flight tokens its tickets would hold."""
        return sum(ticket.tokens for ticket in self._tickets)

    def seats(self) -> int:
        """The upstream sequences its tickets would run."""
        return sum(ticket.seats for ticket in self._tickets)
