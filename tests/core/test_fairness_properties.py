"""SPEC section 3's guarantees, checked on random overloaded multi-client workloads.

Each example replays a random workload through the real scheduler, one step per
virtual second, and checks at every step:
- the counters of clients with waiting requests differ by at most
  B = max(w_in * L_in, w_out * M), M the most tokens a batch holds over its requests'
  lives (the KV pool, or more under reserve admission's peak check: `batch_span`);
- any two clients backlogged over an interval received service within 2B of each other;
- work conservation: while anyone waits, the step is not empty, and the head waits
  only because the batch is full or memory is short;
- no KV block is leaked, and none is held once everything finished or was aborted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenfair.core.batch import ExecutorOutput
from tokenfair.core.policies import make_policy
from tokenfair.core.policies.miss_avoiding import MissAvoidingPick
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.vtc import VTCPolicy
from tokenfair.core.request import Request, RequestStatus
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.core.step_share import newcomer_chunk

from .helpers import batch_span, make_request, run_to_end

W_IN, W_OUT = 1.0, 2.0


@dataclass
class Workload:
    requests: list[tuple[float, str, int, int]]  # arrival, client, input, output
    aborts: list[tuple[int, int]]  # (step, index of request to abort)
    max_num_seqs: int
    kv_tokens: int
    # Per request: (prefix group, prefix tokens) or None; empty: no request shares one.
    prefixes: list[tuple[str, int] | None] = field(default_factory=list)
    # The widest batch_span its replay has run so far (the bound's M, with the pool).
    span: int = 0


@st.composite
def workloads(draw, with_aborts: bool = False) -> Workload:
    num_clients = draw(st.integers(2, 5))
    requests = []
    for c in range(num_clients):
        # Every client sends more than the server can serve: all are backlogged.
        count = draw(st.integers(4, 14))
        for _ in range(count):
            arrival = float(draw(st.integers(0, 30)))
            requests.append((arrival, f"c{c}", draw(st.integers(1, 24)), draw(st.integers(1, 24))))
    aborts = []
    if with_aborts:
        aborts = draw(
            st.lists(st.tuples(st.integers(0, 80), st.integers(0, len(requests) - 1)), max_size=8)
        )
    return Workload(
        requests=sorted(requests),
        aborts=aborts,
        max_num_seqs=draw(st.integers(1, 8)),
        # Small pools keep B = w_out * M tight against requests of up to 48 tokens.
        kv_tokens=draw(st.sampled_from([48, 64, 96])),
    )


@st.composite
def prefix_workloads(draw) -> Workload:
    """Overloaded workloads whose clients share prompt prefixes: each client has a
    system prompt, and some requests are turns of a conversation (whole prompt shared)."""
    num_clients = draw(st.integers(2, 4))
    requests, prefixes = [], []
    for c in range(num_clients):
        system = draw(st.integers(1, 16))
        for turn in range(draw(st.integers(4, 12))):
            arrival = float(draw(st.integers(0, 30)))
            kind = draw(st.sampled_from(["system", "conversation", "none"]))
            question = draw(st.integers(1, 8))
            output = draw(st.integers(1, 16))
            if kind == "system":
                requests.append((arrival, f"c{c}", system + question, output))
                prefixes.append((f"c{c}/system", system))
            elif kind == "conversation":
                prompt = question + 2 * turn
                requests.append((arrival, f"c{c}", prompt, output))
                prefixes.append((f"c{c}/conversation", prompt))
            else:
                requests.append((arrival, f"c{c}", question, output))
                prefixes.append(None)
    order = sorted(range(len(requests)), key=lambda i: requests[i])
    return Workload(
        requests=[requests[i] for i in order],
        aborts=[],
        max_num_seqs=draw(st.integers(1, 8)),
        kv_tokens=draw(st.sampled_from([48, 64, 96])),
        prefixes=[prefixes[i] for i in order],
    )


def service(requests: list[Request], charge_first_token: bool = True) -> dict[str, float]:
    """Service each client received so far: admitted prompts plus generated tokens."""
    totals: dict[str, float] = {}
    for r in requests:
        if r.ever_admitted:
            outputs = r.num_output_tokens - (0 if charge_first_token else 1)
            totals[r.client] = (
                totals.get(r.client, 0.0) + W_IN * r.input_tokens + W_OUT * max(outputs, 0)
            )
    return totals


def replay(workload: Workload, policy_name: str, config: SchedulerConfig, observe) -> Scheduler:
    scheduler = Scheduler(config, make_policy(policy_name))
    made = made_requests(workload)
    aborts: dict[int, list[int]] = {}
    for step, index in workload.aborts:
        aborts.setdefault(step, []).append(index)

    def before(step: int) -> None:
        for index in aborts.get(step, ()):
            scheduler.abort(made[index].request_id, float(step))
        observe(scheduler, made, step)

    def after(out) -> None:
        workload.span = max(workload.span, batch_span(out))
        scheduler.kv.check_invariants()
        if scheduler.has_unfinished():
            assert out.scheduled, "the server idled while requests were unfinished"

    run_to_end(scheduler, made, before, after)
    return scheduler


def counter_spreads(workload: Workload):
    """(excesses, observe): `observe` records, at every step, how far apart the counters
    of the clients with waiting requests are, less the bound B at that step (B grows
    with the widest batch run so far); the check is that no excess is positive."""
    excesses: list[float] = []

    def observe(scheduler, made, step):
        counters = scheduler.policy.counters()
        waiting = {r.client for r in scheduler.policy.waiting_requests()}
        if len(waiting) >= 2:
            values = [counters[c] for c in waiting]
            excesses.append(max(values) - min(values) - bound(workload))

    return excesses, observe


def made_requests(workload: Workload) -> list[Request]:
    made = [
        make_request(client=c, input_tokens=i, output_tokens=o, arrival_s=t)
        for t, c, i, o in workload.requests
    ]
    for request, prefix in zip(made, workload.prefixes, strict=False):
        if prefix is not None:
            request.prefix_group, request.prefix_tokens = prefix
    return made


def bound(workload: Workload) -> float:
    """B of SPEC section 3 (block size 1, so the pool holds exactly kv_tokens tokens),
    with M the pool or the widest batch span replayed so far, whichever is larger."""
    longest_input = max(i for _, _, i, _ in workload.requests)
    widest = max(workload.kv_tokens, workload.span)
    return max(W_IN * longest_input, max(W_IN, W_OUT) * widest)


def engine_config(workload: Workload, **overrides) -> SchedulerConfig:
    settings_ = dict(
        kv_tokens=workload.kv_tokens,
        block_size=1,
        max_num_seqs=workload.max_num_seqs,
        max_batched_tokens=4096,
    )
    settings_.update(overrides)
    return SchedulerConfig(**settings_)


PROPERTY_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# The two bounds are the paper's, proved without preemption: reserve admission never
# preempts for memory, and seat sharing (which moves seats between tenants) is off. With optimistic admission a recompute-preempted request's client rejoins the
# waiting set carrying the charges of the tokens it already produced, which can exceed B
# a little (docs/fairness.md).


@PROPERTY_SETTINGS
@given(workloads(), st.booleans())
def test_vtc_counters_of_waiting_clients_stay_within_bound(workload, charge_first):
    excesses, observe = counter_spreads(workload)

    config = engine_config(
        workload, admission="reserve", share_seats=False, charge_first_token=charge_first
    )
    scheduler = replay(workload, "vtc", config, observe)
    assert scheduler.num_preemptions == 0
    assert max(excesses, default=0.0) <= 0


@PROPERTY_SETTINGS
@given(workloads(), st.booleans())
def test_vtc_backlogged_clients_service_differs_by_at_most_twice_the_bound(workload, charge_first):
    history: list[tuple[set[str], dict[str, float]]] = []

    def observe(scheduler, made, step):
        waiting = {r.client for r in scheduler.policy.waiting_requests()}
        history.append((waiting, service(made, charge_first)))

    config = engine_config(
        workload, admission="reserve", share_seats=False, charge_first_token=charge_first
    )
    replay(workload, "vtc", config, observe)
    assert widest_backlogged_gap(workload, history) <= 2 * bound(workload)


def widest_backlogged_gap(workload: Workload, history) -> float:
    """The largest change of W_a - W_b over any run of steps where a and b both wait."""
    widest = 0.0
    clients = sorted({c for _, c, _, _ in workload.requests})
    for a in clients:
        for b in clients:
            if a >= b:
                continue
            low = high = None
            for waiting, served in history:
                if a in waiting and b in waiting:
                    gap = served.get(a, 0.0) - served.get(b, 0.0)
                    low = gap if low is None else min(low, gap)
                    high = gap if high is None else max(high, gap)
                    widest = max(widest, high - low)
                else:
                    low = high = None
    return widest


def test_the_service_check_catches_fcfs_head_of_line_blocking():
    # The same check on FCFS must fail, or it proves nothing: c0 floods, c1 waits.
    requests = [(0.0, "c0", 20, 20)] * 30 + [(1.0, "c1", 20, 20)] * 5
    workload = Workload(requests=requests, aborts=[], max_num_seqs=2, kv_tokens=48)
    history = []

    def observe(scheduler, made, step):
        waiting = {r.client for r in scheduler.policy.waiting_requests()}
        history.append((waiting, service(made)))

    replay(workload, "fcfs", engine_config(workload), observe)
    assert widest_backlogged_gap(workload, history) > 2 * bound(workload)


def check_work_conservation(workload: Workload, policy_name: str, config: SchedulerConfig):
    """Every step runs something while requests are unfinished, and a waiting head is
    left out only when the batch is full or the pool cannot take it (its cached prefix
    counted)."""
    scheduler = Scheduler(config, make_policy(policy_name))
    made = made_requests(workload)
    next_arrival, step = 0, 0
    while next_arrival < len(made) or scheduler.has_unfinished():
        while next_arrival < len(made) and made[next_arrival].arrival_s <= step:
            scheduler.add_request(made[next_arrival], step)
            next_arrival += 1
        if scheduler.has_unfinished():
            out = scheduler.schedule(step)
            assert out.scheduled, "idle step while requests wait"
            head = scheduler.policy.peek()
            if head is not None:
                kv = scheduler.kv
                full = len(scheduler.running) >= config.max_num_seqs
                hit = kv.lookup_prefix(head)
                # New blocks past its cached prefix, plus the idle cached ones it takes.
                wanted = kv.blocks_for(head.num_tokens) - len(hit.blocks) + hit.idle_blocks
                short = wanted > kv.num_free_blocks
                # With the step shared, a tenant that had its share of this step's
                # prompt tokens waits for the next step (an eighth of the share when a
                # newcomer's first token was cut for).
                limit = config.step_share_tokens
                shared = limit is not None and sum(
                    s.num_new_tokens
                    for s in out.scheduled
                    if s.request.client == head.client and s.num_new_tokens > 1
                ) >= newcomer_chunk(limit)
                # A head short of memory steps aside for tenants within their share, and
                # one that gave memory to another does not take it back in that step.
                aside = head.client in scheduler.stepped_aside
                assert full or short or shared or aside, (
                    f"a waiting request that fits was not admitted ({policy_name}): {head.request_id} "
                    f"of {head.client} ({wanted} blocks, {kv.num_free_blocks} free), "
                    f"step share {limit}, scheduled "
                    f"{[(x.request.request_id, x.request.client, x.start, x.num_new_tokens, x.request.num_tokens) for x in out.scheduled]} running {len(scheduler.running)}"
                )
            sampled = {
                s.request.request_id: 0
                if s.request.num_output_tokens + 1 >= s.request.target_output_tokens
                else 1
                for s in out.scheduled
                if s.samples
            }
            scheduler.update(out, ExecutorOutput(sampled=sampled), step)
        step += 1


@PROPERTY_SETTINGS
@given(
    workloads(),
    st.sampled_from(["fcfs", "vtc", "lcf", "vtc-predict", "priority", "sjf"]),
    st.sampled_from([None, 64]),  # the step shared or not
)
def test_work_conservation(workload, policy_name, step_share):
    config = engine_config(workload, step_share_tokens=step_share)
    check_work_conservation(workload, policy_name, config)


@PROPERTY_SETTINGS
@given(
    prefix_workloads(),
    st.sampled_from(["fcfs", "vtc", "vtc-lpm", "vtc-hit", "vtc-hit:8", "dlpm", "dlpm:8"]),
)
def test_work_conservation_with_shared_prefixes(workload, policy_name):
    config = engine_config(workload, enable_prefix_caching=True)
    check_work_conservation(workload, policy_name, config)


# Locality-aware policies: dlpm lets a client run up to its quantum ahead of the least
# served backlogged client while its prefix is cached, and vtc-hit up to its window when
# VTC's own choice would miss, so VTC's bounds grow by the quantum or the window
# (docs/fairness.md); vtc-lpm only reorders a client's own requests and keeps VTC's
# bounds.


@PROPERTY_SETTINGS
@given(prefix_workloads(), st.sampled_from(["dlpm", "vtc-hit"]), st.integers(1, 64), st.booleans())
def test_locality_counters_of_waiting_clients_stay_within_bound_plus_slack(
    workload, policy, slack, charge_first
):
    """dlpm's quantum or vtc-hit's window is the slack over VTC's bound."""
    excesses, observe = counter_spreads(workload)

    config = engine_config(
        workload,
        admission="reserve",
        share_seats=False,
        charge_first_token=charge_first,
        enable_prefix_caching=True,
    )
    scheduler = replay(workload, f"{policy}:{slack}", config, observe)
    assert scheduler.num_preemptions == 0
    assert max(excesses, default=0.0) <= slack


@PROPERTY_SETTINGS
@given(
    prefix_workloads(),
    st.sampled_from(["dlpm:1", "dlpm:16", "dlpm:64", "vtc-hit:1", "vtc-hit:64", "vtc-lpm"]),
)
def test_locality_policies_keep_backlogged_service_within_twice_the_bound(workload, policy):
    quantum = float(policy.partition(":")[2] or 0)
    history: list[tuple[set[str], dict[str, float]]] = []

    def observe(scheduler, made, step):
        waiting = {r.client for r in scheduler.policy.waiting_requests()}
        history.append((waiting, service(made)))

    config = engine_config(
        workload, admission="reserve", share_seats=False, enable_prefix_caching=True
    )
    replay(workload, policy, config, observe)
    assert widest_backlogged_gap(workload, history) <= 2 * (bound(workload) + quantum)


@PROPERTY_SETTINGS
@given(workloads(), st.booleans(), st.sampled_from(["dlpm:64", "vtc-hit:64"]))
def test_locality_policies_without_shared_prefixes_keep_vtcs_bound(workload, caching, policy):
    excesses, observe = counter_spreads(workload)

    config = engine_config(
        workload, admission="reserve", share_seats=False, enable_prefix_caching=caching
    )
    replay(workload, policy, config, observe)
    assert max(excesses, default=0.0) <= 0


class CheckedMissAvoidingPick(MissAvoidingPick):
    """vtc-hit's rule, its every answer on a miss checked against a scan of every
    backlogged client: the same longest cached prefix and counter (which of equal
    clients goes is the heap's tie order, not checked)."""

    def _nearest_hit(self, limit: float) -> str | None:
        found = super()._nearest_hit(limit)
        counter = self.ledger.counter
        keys = [
            (-queue.head_blocks(), counter(client))
            for client, queue in self.queues.items()
            if queue.head_blocks() and counter(client) < limit
        ]
        got = None if found is None else (-self.queues[found].head_blocks(), counter(found))
        assert got == min(keys, default=None), (got, sorted(keys))
        return found


class CheckedMissAvoidingVTC(VTCPolicy):
    def __init__(self, settings: PolicySettings | None = None, *, window: float) -> None:
        super().__init__(settings, name="vtc-hit", pick=CheckedMissAvoidingPick(window))


def admission_order(workload: Workload, policy: str, **config) -> list[tuple]:
    seen: list[list[Request]] = []

    def observe(scheduler, made, step):
        seen[:] = [made]

    settings_ = dict(admission="reserve", share_seats=False, **config)
    replay(workload, policy, engine_config(workload, **settings_), observe)
    admitted = sorted((r for r in seen[0] if r.ever_admitted), key=lambda r: r.admit_seq)
    return [(r.client, r.arrival_s, r.input_tokens) for r in admitted]


@PROPERTY_SETTINGS
@given(prefix_workloads(), st.sampled_from([1, 8, 64]))
def test_vtc_hit_chooses_as_a_scan_of_every_client_would(workload, window):
    checked = f"{__name__}:CheckedMissAvoidingVTC(window={window})"
    assert admission_order(workload, checked, enable_prefix_caching=True)


@PROPERTY_SETTINGS
@given(workloads(), st.booleans())
def test_vtc_hit_without_shared_prefixes_is_vtc_decision_for_decision(workload, caching):
    """No prompt ever finds a cached prefix it shares with another: every VTC choice
    misses and nobody else hits, so vtc-hit admits exactly as vtc-lpm (VTC) does."""
    assert admission_order(workload, "vtc-hit:64", enable_prefix_caching=caching) == (
        admission_order(workload, "vtc-lpm", enable_prefix_caching=caching)
    )


@pytest.mark.parametrize("policy", ["dlpm", "vtc-hit"])
def test_the_bound_check_catches_longest_prefix_first_without_a_quantum(policy):
    # Longest prefix first alone starves a client whose prefix is never cached: the
    # same check must fail for dlpm (vtc-hit) with a quantum (window) too large to
    # matter, and hold with one of 64.
    requests = [(0.0, "c0", 20, 4)] * 30 + [(0.0, "c1", 20, 4)] * 10
    prefixes = [("c0/system", 16)] * 30 + [None] * 10
    workload = Workload(
        requests=requests, aborts=[], max_num_seqs=1, kv_tokens=48, prefixes=prefixes
    )
    gaps = {}
    for limit in (64, 1000000):
        history = []

        def observe(scheduler, made, step, history=history):
            waiting = {r.client for r in scheduler.policy.waiting_requests()}
            history.append((waiting, service(made)))

        config = engine_config(
            workload, admission="reserve", share_seats=False, enable_prefix_caching=True
        )
        replay(workload, f"{policy}:{limit}", config, observe)
        gaps[limit] = widest_backlogged_gap(workload, history)
    assert gaps[64] <= 2 * (bound(workload) + 64) < gaps[1000000]


@PROPERTY_SETTINGS
@given(
    workloads(with_aborts=True),
    st.sampled_from(["fcfs", "vtc", "vtc-preempt:10", "priority"]),
    st.sampled_from(["recompute", "swap"]),
    st.booleans(),
)
def test_no_kv_block_leaks_after_finish_or_abort(workload, policy_name, preemption, caching):
    config = engine_config(
        workload, preemption=preemption, swap_tokens=32, enable_prefix_caching=caching
    )
    scheduler = replay(workload, policy_name, config, lambda *a: None)
    kv = scheduler.kv
    assert not kv.holders() and not kv.swap_tables
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.num_free_swap_blocks == kv.num_swap_blocks
    assert not scheduler.running and not scheduler.swapped and len(scheduler.policy) == 0


@PROPERTY_SETTINGS
@given(workloads(), st.sampled_from(["recompute", "swap"]))
def test_every_request_produces_exactly_its_output_despite_preemption(workload, preemption):
    made_holder: list[list[Request]] = []

    def observe(scheduler, made, step):
        if not made_holder:
            made_holder.append(made)

    config = engine_config(workload, preemption=preemption, swap_tokens=16)
    replay(workload, "vtc", config, observe)
    for r in made_holder[0]:
        if r.finish_reason.value == "rejected":
            continue
        assert r.status is RequestStatus.FINISHED
        assert r.num_output_tokens == r.target_output_tokens
