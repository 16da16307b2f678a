"""A ticket's states and moves (gateway/flow/ticket.py): written once, enforced."""

from __future__ import annotations

import pytest

from tokenfair.gateway.flow.ticket import MOVES, Ticket, TicketMoveError, TicketState


def _reachable(start: TicketState) -> set[TicketState]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in MOVES[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_is_reached_and_every_one_can_end() -> None:
    assert _reachable(TicketState.NEW) == set(TicketState)
    for state in TicketState:
        if state is not TicketState.NEW:  # a ticket never queued holds nothing to free
            assert TicketState.RELEASED in _reachable(state) | {state}


def test_a_move_the_table_lacks_is_refused() -> None:
    ticket = Ticket(tenant="t", model="m", tokens=10, charge=())
    ticket.move(TicketState.WAITING)
    ticket.move(TicketState.PICKING)
    ticket.move(TicketState.DISPATCHED)
    with pytest.raises(TicketMoveError, match="from dispatched to waiting"):
        ticket.move(TicketState.WAITING)  # a dispatched request never queues again
    assert ticket.state is TicketState.DISPATCHED
