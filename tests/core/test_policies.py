import copy
import random

import pytest

from tokenfair.core.policies import PolicyError, make_policy
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.rate_window import RateWindow
from tokenfair.core.request import FinishReason

from .helpers import make_request


def drain(policy):
    order = []
    while policy.peek() is not None:
        order.append(policy.pop())
    return order


def test_fcfs_serves_in_arrival_order_and_requeues_preempted_first():
    policy = make_policy("fcfs")
    a, b, c = (make_request(arrival_s=t) for t in (1.0, 2.0, 3.0))
    for r in (c, a, b):
        policy.add(r, r.arrival_s)
    assert policy.pop() is a
    late = make_request(arrival_s=9.0)
    policy.requeue(late)  # a preempted request goes ahead of every new arrival
    assert drain(policy) == [late, b, c]


def test_fcfs_remove_drops_a_waiting_request():
    policy = make_policy("fcfs")
    a, b = make_request(arrival_s=0), make_request(arrival_s=1)
    policy.add(a, 0)
    policy.add(b, 1)
    policy.remove(a)
    assert len(policy) == 1
    assert drain(policy) == [b]


def test_priority_orders_by_value_then_arrival_and_picks_lowest_priority_victim():
    policy = make_policy("priority")
    low = make_request(priority=5, arrival_s=0)
    high = make_request(priority=-1, arrival_s=2)
    mid_early, mid_late = (
        make_request(priority=1, arrival_s=0.5),
        make_request(priority=1, arrival_s=1),
    )
    for r in (low, mid_late, high, mid_early):
        policy.add(r, r.arrival_s)
    assert drain(policy) == [high, mid_early, mid_late, low]
    for seq, r in enumerate((low, mid_early, high)):
        r.admit_seq = seq
    assert max([low, mid_early, high], key=policy.victim_key) is low
    assert policy.preempts_for(high, low)  # strictly more important
    assert not policy.preempts_for(make_request(priority=5), low)


def test_sjf_prefers_short_but_ages_long_requests():
    policy = make_policy("sjf:10")
    long_first = make_request(arrival_s=0, output_tokens=1000, predicted=1000)
    short = make_request(arrival_s=1, predicted=10)
    policy.add(long_first, 0)
    policy.add(short, 1)
    assert policy.peek() is short
    # 1000 tokens at 10 tokens/s of aging: anyone arriving 100 s later queues behind it.
    later_short = make_request(arrival_s=101, predicted=1)
    policy.add(later_short, 101)
    assert drain(policy) == [short, long_first, later_short]


def test_sjf_predicts_from_client_history():
    policy = make_policy("sjf")
    done = make_request(client="x", output_tokens=20, max_tokens=500)
    done.extend_output([1] * 20)
    done.finish_reason = FinishReason.STOP
    policy.on_finish(done)
    x_req = make_request(client="x", arrival_s=5, max_tokens=500)
    y_req = make_request(client="y", arrival_s=0, max_tokens=500)  # no history: predicts 256
    policy.add(y_req, 0)
    policy.add(x_req, 5)
    assert policy.peek() is x_req


def test_rpm_rejects_beyond_limit_in_sliding_window():
    policy = make_policy("rpm:2")
    assert policy.accept(make_request(client="a"), 0.0)
    assert policy.accept(make_request(client="a"), 10.0)
    assert not policy.accept(make_request(client="a"), 59.0)
    assert policy.accept(make_request(client="b"), 59.0)  # per client
    assert policy.accept(make_request(client="a"), 60.5)  # the first one left the window


def test_rpm_tells_when_a_place_frees_and_takes_back_a_refused_request():
    window = RateWindow(2)
    assert window.accept("a", 0.0)
    assert window.retry_after("a", 5.0) == 0.0  # a place is free
    assert window.accept("a", 10.0)
    assert window.retry_after("a", 15.0) == 45.0  # the one at 0 leaves the window at 60
    window.unaccept("a")  # the one at 10 was refused later on: it used no place
    assert window.accept("a", 20.0)
    assert not window.accept("a", 21.0)
    policy = make_policy("rpm:2")  # the policy counts with the same window
    assert policy.accept(make_request(client="a"), 0.0)
    assert policy.accept(make_request(client="a"), 1.0)
    assert policy.retry_after("a", 1.0) == 59.0


def test_vtc_admits_smallest_counter_and_charges_input_then_output():
    policy = make_policy("vtc")
    a1 = make_request(client="a", input_tokens=100)
    a2 = make_request(client="a", input_tokens=100)
    b1 = make_request(client="b", input_tokens=10)
    for r in (a1, a2, b1):
        policy.add(r, 0)
    first = policy.pop()
    assert first is a1  # tie at 0: the first client to arrive
    policy.on_admit(a1, True, 0)
    assert policy.counters()["a"] == 100
    assert policy.pop() is b1
    policy.on_admit(b1, True, 0)
    b1.extend_output([1, 1, 1])
    policy.on_output(b1, 3)
    assert policy.counters()["b"] == 10 + 3 * 2
    assert policy.pop() is a2


def test_vtc_lift_to_min_waiting_counter_on_return():
    policy = make_policy("vtc")
    for client in ("a", "b"):
        policy.add(make_request(client=client), 0)
    policy.ledger._counter.update({"a": 500.0, "b": 300.0})  # served since (counters only grow)
    newcomer = make_request(client="c")
    policy.add(newcomer, 0)
    assert policy.counters()["c"] == 300.0  # lifted to the smallest waiting counter
    # A client that is already waiting is not lifted again.
    policy.ledger._counter["c"] = 10.0
    policy.add(make_request(client="c"), 0)
    assert policy.counters()["c"] == 10.0


def test_vtc_lift_with_empty_queue_paper_vs_artifact_vs_lcf():
    def after_idle(name):
        policy = make_policy(name)
        heavy = make_request(client="heavy", input_tokens=400)
        policy.add(heavy, 0)
        policy.on_admit(policy.pop(), True, 0)  # heavy is the last admitted, counter 400
        policy.add(make_request(client="idle"), 1)  # nobody else waits
        return policy.counters()["idle"]

    assert after_idle("vtc") == 400  # paper: lift to the last admitted client's counter
    assert after_idle("vtc-artifact") == 0  # the authors' code skips this lift
    assert after_idle("lcf") == 0


def test_vtc_a_pop_put_back_admits_nobody():
    """vLLM's scheduler pops a request and puts it back when it does not fit: the
    lift's reference (the last admitted client) must not move to it."""
    policy = make_policy("vtc")
    light = make_request(client="light", input_tokens=400)
    policy.add(light, 0)
    policy.on_admit(policy.pop(), True, 0)  # light: last admitted, counter 400
    policy.ledger._counter["heavy"] = 5000.0  # served long ago
    tried = make_request(client="heavy")
    policy.add(tried, 1)
    assert policy.pop() is tried
    policy.requeue(tried)  # it did not fit
    policy.remove(tried)  # and its client left
    policy.add(make_request(client="idle"), 2)  # nobody else waits
    assert policy.counters()["idle"] == 400  # lifted to light's counter, not heavy's


def test_weighted_vtc_divides_charges_by_weight():
    policy = make_policy("wvtc", weights={"a": 1, "b": 4})
    for client in ("a", "b"):
        policy.add(make_request(client=client, input_tokens=40), 0)
    for _ in range(2):
        policy.on_admit(policy.pop(), True, 0)
    assert policy.counters() == {"a": 40, "b": 10}
    with pytest.raises(PolicyError, match="weights"):
        make_policy("wvtc")


def test_vtc_predict_charges_prediction_then_excess_and_refunds():
    policy = make_policy("vtc-predict")
    r = make_request(client="a", input_tokens=10, output_tokens=50, predicted=20)
    policy.add(r, 0)
    policy.on_admit(policy.pop(), True, 0)
    assert policy.counters()["a"] == 10 + 2 * 20
    r.extend_output([1] * 5)
    policy.on_output(r, 5)
    assert policy.counters()["a"] == 50  # within the prediction: nothing more
    r.extend_output([1] * 20)  # 25 in all
    policy.on_output(r, 20)
    assert policy.counters()["a"] == 10 + 2 * 25
    short = make_request(client="a", input_tokens=10, output_tokens=5, predicted=20)
    policy.add(short, 0)
    policy.on_admit(policy.pop(), True, 0)
    short.extend_output([1] * 5)
    short.finish_reason = FinishReason.STOP
    policy.on_output(short, 5)
    policy.on_finish(short)
    assert policy.counters()["a"] == 60 + 10 + 2 * 5  # unused prediction refunded


def test_vtc_oracle_charges_true_length_at_admission():
    policy = make_policy("vtc-oracle")
    r = make_request(client="a", input_tokens=10, output_tokens=30)
    policy.add(r, 0)
    policy.on_admit(policy.pop(), True, 0)
    assert policy.counters()["a"] == 10 + 2 * 30


def test_vtc_readmission_after_recompute_does_not_charge_prompt_again():
    policy = make_policy("vtc")
    r = make_request(client="a", input_tokens=10)
    policy.add(r, 0)
    policy.on_admit(policy.pop(), True, 0)
    policy.requeue(r)
    policy.on_admit(policy.pop(), False, 1)
    assert policy.counters()["a"] == 10


def test_vtc_victim_and_preempt_threshold():
    policy = make_policy("vtc-preempt:100")
    policy.ledger._counter.update({"heavy": 1000.0, "light": 0.0})
    old, new = make_request(client="heavy"), make_request(client="heavy")
    old.admit_seq, new.admit_seq = 1, 2
    light_running = make_request(client="light")
    light_running.admit_seq = 3
    assert max([old, new, light_running], key=policy.victim_key) is new
    head = make_request(client="light")
    assert policy.preempts_for(head, new)
    policy.ledger._counter["light"] = 950.0
    assert not policy.preempts_for(head, new)  # within the threshold
    assert not make_policy("vtc").preempts_for(head, new)


def test_vtc_orders_a_clients_own_requests_by_priority_not_across_clients():
    policy = make_policy("vtc")
    first, urgent, later, lax = (
        make_request(client="a", priority=p, arrival_s=t)
        for p, t in ((0, 0.0), (-5, 1.0), (0, 2.0), (3, 3.0))
    )
    other = make_request(client="b", priority=9, arrival_s=0.5)
    for r in (first, other, urgent, later, lax):
        policy.add(r, r.arrival_s)
    assert policy.pop() is urgent  # a's most urgent, although it came second
    policy.on_admit(urgent, True, 1.0)  # a is charged 4: b (0) goes next, priority 9 or not
    assert policy.pop() is other
    policy.on_admit(other, True, 1.0)
    policy.requeue(urgent)  # preempted: first again among its equals, ahead of priority 0
    back = make_request(client="a", priority=0, arrival_s=4.0)
    policy.requeue(back)  # a preempted priority 0: before the waiting ones of its priority
    assert drain(policy) == [urgent, back, first, later, lax]


def test_vtc_priority_queues_agree_with_sorting_under_random_operations():
    rng = random.Random(11)
    policy = make_policy("vtc")
    expected: list = []  # one client: (priority, order) decides; requeues go first
    first_seq = 0
    for step in range(2000):
        if rng.random() < 0.6 or not expected:
            r = make_request(client="a", priority=rng.randint(-2, 2), arrival_s=step)
            policy.add(r, step)
            expected.append((r.priority, step, r))
        elif rng.random() < 0.2:
            first_seq -= 1
            r = make_request(client="a", priority=rng.randint(-2, 2), arrival_s=step)
            policy.requeue(r)
            expected.append((r.priority, first_seq - 10_000, r))
        else:
            expected.sort(key=lambda e: e[:2])
            assert policy.pop() is expected.pop(0)[2]
    expected.sort(key=lambda e: e[:2])
    assert drain(policy) == [e[2] for e in expected]


def test_vtc_heap_agrees_with_brute_force_under_random_operations():
    rng = random.Random(7)
    policy = make_policy("vtc-predict")
    assert isinstance(policy, VTCPolicy)
    clients = [f"c{i}" for i in range(12)]
    admitted = []
    for step in range(3000):
        op = rng.random()
        if op < 0.4:
            c = rng.choice(clients)
            policy.add(
                make_request(
                    client=c, input_tokens=rng.randint(1, 50), predicted=rng.randint(1, 40)
                ),
                step,
            )
        elif op < 0.7 and len(policy):
            waiting = {r.client for r in policy.waiting_requests()}
            expected = min(policy.counters()[c] for c in waiting)
            head = policy.peek()
            assert policy.counters()[head.client] == expected
            r = policy.pop()
            policy.on_admit(r, True, step)
            admitted.append(r)
        elif op < 0.9 and admitted:
            r = rng.choice(admitted)
            r.append_output(1)
            policy.on_output(r, 1)
        elif admitted:
            r = admitted.pop(rng.randrange(len(admitted)))
            r.finish_reason = FinishReason.STOP
            policy.on_finish(r)  # may refund: counters shrink
        if rng.random() < 0.05 and len(policy):
            policy.remove(rng.choice(list(policy.waiting_requests())))
    assert len(policy) == sum(1 for _ in policy.waiting_requests())


@pytest.mark.parametrize(
    "name", ["fcfs", "priority", "sjf", "vtc", "wvtc", "vtc-artifact", "vtc-lpm"]
)
def test_waiting_requests_are_listed_in_pop_order(name):
    """The listing is what successive pops would return, requeues and charges included."""
    rng = random.Random(11)
    policy = make_policy(name, weights={"c0": 2.0, "c1": 0.5} if name == "wvtc" else None)
    admitted = []
    for step in range(400):
        op = rng.random()
        if op < 0.45:
            request = make_request(client=f"c{rng.randrange(5)}", input_tokens=rng.randint(1, 60))
            request.priority = rng.randrange(3)
            policy.add(request, step)
        elif op < 0.75 and len(policy):
            request = policy.pop()
            policy.on_admit(request, True, step)
            admitted.append(request)
        elif op < 0.9 and admitted:
            request = rng.choice(admitted)
            request.append_output(1)
            policy.on_output(request, 1)
        elif admitted:
            policy.requeue(admitted.pop(rng.randrange(len(admitted))))  # preempted
        if step % 40 == 39:
            listed = [r.request_id for r in policy.waiting_requests()]
            assert len(listed) == len(policy)
            assert listed == [r.request_id for r in drain(copy.deepcopy(policy))]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "unknown policy"),
        ("rpm", "needs a limit"),
        ("rpm:x", "whole number of requests per minute"),
        ("rpm:2.5", "whole number of requests per minute"),
        ("rpm:0", "whole number of requests per minute"),
        ("sjf:x", "not a number"),
        ("fcfs:3", "takes no argument"),
        ("sjf:-1", "aging"),
        ("vtc-preempt:-5", "threshold"),
    ],
)
def test_registry_errors_say_what_to_fix(spec, message):
    with pytest.raises(PolicyError, match=message):
        make_policy(spec)


def test_registry_builds_every_documented_policy():
    names = [
        "fcfs",
        "priority",
        "sjf",
        "sjf:5",
        "rpm:20",
        "lcf",
        "vtc",
        "vtc-artifact",
        "vtc-predict",
        "vtc-oracle",
        "vtc-preempt",
        "vtc-preempt:1000",
    ]
    for name in names:
        assert make_policy(name).name.split(":")[0] == name.split(":")[0]
    assert make_policy("wvtc", weights={"a": 2}).name == "wvtc"
