"""A tenant's share of the batch's seats: whose seat goes to a blocked tenant.

VTC decides who is admitted next, not how long an admitted tenant keeps its seats: a
tenant that arrived alone may fill every seat (two requests with `n=128` fill 256), and
then another tenant's request waits for one of those generations to finish, however
low its counter is. Counter-gap preemption (vtc-preempt) frees a seat once the gap
passes its threshold, which takes as long as the heavy tenant needs to be charged that
much.

The seat-share rule bounds the holding itself. When every seat is taken and the head
of the queue waits for one, the seats are shared by weight among the tenants holding
them and the head's. If the head's tenant stays within its share with
one more seat, and another tenant stays at or over its share with one fewer, that
tenant's newest request gives its seat up (recompute). Each such move takes a seat from
a tenant at least one over its share to one at least one under: the sum of squared
distances from the shares falls by at least 2, so with the tenants unchanged the rule
settles after a bounded number of preemptions and never hands a seat back and forth.

Only seats: KV memory is shared by its own rules (memory_share.py), which differ where
memory differs from seats: a request's blocks vary a thousandfold, so a tenant over its
share of the pool steps aside before anyone is pushed out, and only a tenant within its
share takes memory from one over it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenfair.core.policies.view import RequestView


def seat_share_victim(
    head: RequestView, running: Sequence[RequestView], weight_of: Callable[[str], float]
) -> RequestView | None:
    """The newest request of the tenant most over its weighted share of the seats, when
    its seat can go to `head` without either tenant crossing its share; else None."""
    seats: dict[str, int] = {}
    newest: dict[str, RequestView] = {}
    for request in running:
        client = request.client
        seats[client] = seats.get(client, 0) + 1
        if client not in newest or request.admit_seq > newest[client].admit_seq:
            newest[client] = request
    total_weight = sum(weight_of(client) for client in dict.fromkeys([*seats, head.client]))
    total_seats = len(running)  # a seat moves: the count stays

    def share(client: str) -> float:
        return total_seats * weight_of(client) / total_weight

    if seats.get(head.client, 0) + 1 > share(head.client):
        return None  # the head's tenant already has its share: it waits its turn
    # Most over-served per unit of weight first: with unequal weights the first may be
    # within one seat of its share while a heavier tenant is a whole seat over.
    for client in sorted(seats, key=lambda c: seats[c] / weight_of(c), reverse=True):
        if client != head.client and seats[client] - 1 >= share(client):
            return newest[client]
    return None
