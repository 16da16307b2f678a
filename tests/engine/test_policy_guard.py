"""A served policy's failure: GuardedPolicy switches to fcfs for good, carrying over the
waiting requests in arrival order (engine/policy_guard.py)."""

from __future__ import annotations

import logging

import pytest

from tests.core.helpers import fake_step, make_request
from tokenfair.core.policies import make_policy
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.policy_guard import GuardedPolicy


class FailsIn(VTCPolicy):
    """VTC whose `hook` raises from its `after`-th call on."""

    def __init__(self, hook: str, after: int) -> None:
        super().__init__(name="fails")
        self.calls = 0
        self.after = after
        real = getattr(self, hook)

        def failing(*args, **kwargs):
            self.calls += 1
            if self.calls >= self.after:
                raise RuntimeError(f"{hook} call {self.calls}")
            return real(*args, **kwargs)

        setattr(self, hook, failing)


def requests_of_two_tenants(count: int):
    return [
        make_request(client="ab"[i % 2], input_tokens=8, output_tokens=3, arrival_s=float(i))
        for i in range(count)
    ]


@pytest.mark.parametrize(
    "hook", ["peek", "pop", "add", "on_admit", "on_output", "on_finish", "waiting_requests"]
)
def test_every_request_finishes_after_a_hook_fails(hook, caplog):
    policy = GuardedPolicy(FailsIn(hook, after=3))
    scheduler = Scheduler(SchedulerConfig(kv_tokens=256, block_size=4, max_num_seqs=2), policy)
    made = requests_of_two_tenants(8)
    with caplog.at_level(logging.DEBUG, logger="tokenfair.engine.policy_guard"):
        for request in made:
            scheduler.add_request(request, request.arrival_s)
        for step in range(200):
            if not scheduler.has_unfinished():
                break
            fake_step(scheduler, 10.0 + step)
            scheduler.policy.waiting_requests()  # as the metrics read it
            list(scheduler.policy.waiting_requests())
    assert all(r.is_finished for r in made) and not scheduler.has_unfinished()
    assert policy.status() == {
        "name": "fails",
        "failed": True,
        "hook": hook,
        "error": f"RuntimeError: {hook} call 3",
        "fallback": "fcfs",
    }
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "'fails'" in errors[0].getMessage() and f"hook {hook} " in errors[0].getMessage()


def test_the_waiting_requests_go_on_in_arrival_order_preempted_first():
    policy = GuardedPolicy(FailsIn("peek", after=1))
    made = requests_of_two_tenants(5)
    for request in reversed(made[1:]):  # told out of order: the order is by arrival
        policy.add(request, 0.0)
    policy.requeue(made[0])  # preempted: it goes back ahead
    assert policy.peek() is made[0]  # the failing peek is answered by fcfs
    order = [policy.pop() for _ in range(len(made))]
    # The rank of a request is the order the driver told the policy of it; fcfs then
    # orders by arrival, a preempted request first.
    assert order == [made[0], *made[1:]]
    assert policy.active.name == "fcfs" and len(policy) == 0


def test_a_failing_pop_hands_the_driver_what_peek_showed():
    policy = GuardedPolicy(FailsIn("pop", after=1))
    made = requests_of_two_tenants(4)
    for request in made:
        policy.add(request, request.arrival_s)
    policy.on_admit(make_request(client="a"), True, 0.0)  # VTC now prefers b
    shown = policy.peek()
    assert shown is not None and shown.client == "b"
    assert policy.pop() is shown
    assert [policy.pop() for _ in range(3)] == [r for r in made if r is not shown]


def test_a_working_policy_is_untouched():
    inner = make_policy("vtc")
    policy = GuardedPolicy(inner)
    made = requests_of_two_tenants(4)
    for request in made:
        policy.add(request, request.arrival_s)
    assert policy.peek() is inner.peek()
    assert policy.pop() is made[0]
    policy.on_admit(made[0], True, 0.0)
    assert policy.counters() == inner.counters() and policy.counters()["a"] > 0
    assert policy.charges_output and policy.status() == {"name": "vtc", "failed": False}
    assert policy.failures == 0 and policy.active is inner
