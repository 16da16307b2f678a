"""Seat sharing: a tenant that fills every seat gives one up to a tenant that has none.

The report it answers: under VTC, two requests with `n=128` filled all 256 seats, and
another tenant's 4-token request waited for one of those 3,000-token generations to
finish. Under the VTC family a tenant over its weighted share of the seats now gives
its newest seat up to a tenant under it, within the step the newcomer is first seen.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.helpers import fake_step, make_request
from tokenfair.core.policies.batch_share import seat_share_victim
from tokenfair.core.policies.registry import make_policy
from tokenfair.core.request import RequestStatus
from tokenfair.core.scheduler import Scheduler, SchedulerConfig

SEATS = 8


def scheduler(
    policy: str = "vtc", weights: dict[str, float] | None = None, share_seats: bool = True
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=SEATS, kv_tokens=100_000, block_size=16, share_seats=share_seats
    )
    return Scheduler(config, make_policy(policy, weights=weights))


def fill_with_heavy(sched: Scheduler, count: int = SEATS) -> list:
    heavy = [make_request("heavy", input_tokens=8, output_tokens=3000) for _ in range(count)]
    for request in heavy:
        sched.add_request(request, 0.0)
    for step in range(3):
        fake_step(sched, step * 0.01)
    assert len(sched.running) == count
    return heavy


def steps_until_first_token(sched: Scheduler, request, start: float) -> int:
    for step in range(1, 500):
        fake_step(sched, start + step * 0.01)
        if request.num_output_tokens:
            return step
    return 10**6


def test_a_newcomer_takes_a_seat_from_the_tenant_holding_them_all() -> None:
    sched = scheduler()
    heavy = fill_with_heavy(sched)
    light = make_request("light", input_tokens=4, output_tokens=4)
    sched.add_request(light, 1.0)
    # It waits the scheduler's patience for a seat to free by itself, then takes one.
    patience = sched.config.seat_patience_steps
    assert steps_until_first_token(sched, light, 1.0) == patience + 1
    # The heavy tenant's newest request gave its seat up, and waits at its queue's front.
    newest = max(heavy, key=lambda r: r.admit_seq)
    assert newest.status is RequestStatus.PREEMPTED
    assert sched.num_policy_preemptions == 1


def test_a_seat_that_frees_within_the_patience_costs_no_preemption() -> None:
    sched = scheduler()
    heavy = [make_request("heavy", input_tokens=8, output_tokens=5) for _ in range(SEATS)]
    for request in heavy:
        sched.add_request(request, 0.0)
    fake_step(sched, 0.0)
    light = make_request("light", input_tokens=4, output_tokens=4)
    sched.add_request(light, 0.5)
    assert steps_until_first_token(sched, light, 0.5) <= sched.config.seat_patience_steps + 1
    assert sched.num_policy_preemptions == 0


def test_without_seat_sharing_the_newcomer_waits_for_a_generation_to_end() -> None:
    """As the paper's system does: a seat is kept until its request ends."""
    sched = scheduler(share_seats=False)
    fill_with_heavy(sched)
    light = make_request("light", input_tokens=4, output_tokens=4)
    sched.add_request(light, 1.0)
    assert steps_until_first_token(sched, light, 1.0) > 100
    assert sched.num_policy_preemptions == 0


def test_fcfs_keeps_arrival_order_for_seats_too() -> None:
    """Seats are the VTC family's to share: FCFS (and a policy that does not say
    otherwise) keeps them until their requests end."""
    sched = scheduler("fcfs")
    fill_with_heavy(sched)
    light = make_request("light", input_tokens=4, output_tokens=4)
    sched.add_request(light, 1.0)
    assert steps_until_first_token(sched, light, 1.0) > 100


def test_seats_settle_at_the_shares_and_are_not_handed_back() -> None:
    """Two tenants each wanting every seat end at half each, then no more preemptions."""
    sched = scheduler()
    fill_with_heavy(sched)
    for _ in range(SEATS):
        sched.add_request(make_request("light", input_tokens=4, output_tokens=3000), 1.0)
    for step in range(1, 40):
        fake_step(sched, 1.0 + step * 0.01)
    held = [r.client for r in sched.running]
    assert held.count("light") == held.count("heavy") == SEATS // 2
    assert sched.num_policy_preemptions == SEATS // 2


def test_weights_set_the_shares_of_seats() -> None:
    sched = scheduler(weights={"heavy": 1.0, "light": 3.0})
    fill_with_heavy(sched)
    for _ in range(SEATS):
        sched.add_request(make_request("light", input_tokens=4, output_tokens=3000), 1.0)
    for step in range(1, 40):
        fake_step(sched, 1.0 + step * 0.01)
    held = [r.client for r in sched.running]
    assert (held.count("heavy"), held.count("light")) == (2, 6)


def test_a_tenant_at_its_share_waits_its_turn() -> None:
    sched = scheduler()
    fill_with_heavy(sched, count=SEATS // 2)
    for _ in range(SEATS // 2):
        sched.add_request(make_request("light", input_tokens=4, output_tokens=3000), 0.5)
    fake_step(sched, 0.5)
    extra = make_request("light", input_tokens=4, output_tokens=4)
    sched.add_request(extra, 1.0)
    fake_step(sched, 1.01)
    assert extra.status is RequestStatus.WAITING
    assert sched.num_policy_preemptions == 0


class View:
    """Just what the rule reads of a request."""

    def __init__(self, client: str, admit_seq: int) -> None:
        self.client, self.admit_seq = client, admit_seq


@settings(max_examples=300, deadline=None)
@given(
    held=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 12), min_size=1, max_size=6),
    weights=st.dictionaries(st.sampled_from("abcdefg"), st.sampled_from([0.5, 1, 2, 5])),
    newcomer=st.sampled_from("abcdefg"),
)
def test_every_seat_move_brings_both_tenants_towards_their_shares(
    held: dict[str, int], weights: dict[str, float], newcomer: str
) -> None:
    """Whatever the holdings and weights: the rule only takes a seat from a tenant that
    keeps at least its share and gives it to one that stays within its share, so the
    sum of squared distances from the shares falls (no seat goes back and forth)."""
    running = [View(c, i * 100 + k) for i, (c, n) in enumerate(held.items()) for k in range(n)]
    if not running:
        return

    def weight(client: str) -> float:
        return weights.get(client, 1.0)

    victim = seat_share_victim(View(newcomer, 10**9), running, weight)  # type: ignore[arg-type]
    if victim is None:
        return
    clients = {v.client for v in running} | {newcomer}
    seats = {c: sum(v.client == c for v in running) for c in clients}
    total = len(running)
    share = {c: total * weight(c) / sum(weight(o) for o in clients) for c in clients}
    assert victim.client != newcomer
    assert seats[victim.client] - 1 >= share[victim.client]
    assert seats[newcomer] + 1 <= share[newcomer]
    assert victim.admit_seq == max(v.admit_seq for v in running if v.client == victim.client)
    before = sum((seats[c] - share[c]) ** 2 for c in clients)
    seats[victim.client] -= 1
    seats[newcomer] += 1
    assert sum((seats[c] - share[c]) ** 2 for c in clients) <= before - 2 + 1e-9
