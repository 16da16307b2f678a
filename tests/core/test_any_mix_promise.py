"""The promise, on random mixes: a tenant under its weighted share of every resource is
not held up by tenants over theirs, however many they are and whatever they fill.

Hypothesis draws the mix: one to three heavy tenants (weights 1-3) each backlogged
with long prompts of up to half the pool, and one or two light tenants (weights 1-3)
sending short requests now and then, far under their share of the seats, the pool and
the step. The bound checked, from the step a light request reaches the head of its
tenant's queue to the step it starts:

    seat_patience_steps + memory_patience_steps + 2 + the life of one heavy request

The seat and memory patience are what the rule waits before it takes a seat or
memory; two steps are the step that finds the head blocked and the one that starts
it; the life of one heavy request (its prompt at its part of the step share, then its
generation) is the one wait the rule allows: a light head within its share whose
memory could only come from a tenant holding a single request, which would be left
holding less than the light tenant (that request is not recomputed for it: it ends
and frees its blocks). The bound does not grow with the number of heavy tenants'
requests, their queues, or what they fill. And a step that runs a light tenant's
request carries at most one step share of the heavy tenants' prompt tokens together
(and the eighth of it their chunks are cut to beside a starting request), not one per
heavy tenant. Before every blocked
head let a tenant within its share pass, a second long-prompt tenant's blocked head
kept the light tenants waiting for whole generations of the first one, and the step
carried a share of prompt tokens per heavy tenant.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.helpers import fake_step, make_request
from tokenfair.core.policies.registry import make_policy
from tokenfair.core.request import RequestStatus
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.core.step_share import newcomer_chunk

POOL_TOKENS = 4096
LONGEST_HEAVY_OUTPUT = 12
STEP_SHARE = 512
STEPS = 300


@dataclass(frozen=True)
class Mix:
    heavy: list[tuple[int, list[tuple[int, int]]]]  # weight, (prompt, output) per request
    light: list[tuple[int, int, list[tuple[int, int]]]]  # weight, every k steps, requests


heavy_requests = st.lists(
    st.tuples(st.integers(200, POOL_TOKENS // 2), st.integers(1, LONGEST_HEAVY_OUTPUT)),
    min_size=4,
    max_size=10,
)
light_requests = st.lists(st.tuples(st.integers(8, 96), st.integers(1, 8)), min_size=3, max_size=12)
mixes = st.builds(
    Mix,
    heavy=st.lists(st.tuples(st.integers(1, 3), heavy_requests), min_size=1, max_size=3),
    light=st.lists(
        st.tuples(st.integers(1, 3), st.integers(8, 30), light_requests), min_size=1, max_size=2
    ),
)


def run_mix(mix: Mix) -> tuple[list[int], int]:
    """The steps each light request waited at the head of its tenant's queue, and the
    most prompt tokens of heavy tenants in a step that ran a light tenant's request."""
    weights = {f"heavy-{i}": float(w) for i, (w, _) in enumerate(mix.heavy)}
    weights |= {f"light-{i}": float(w) for i, (w, _, _) in enumerate(mix.light)}
    config = SchedulerConfig(
        kv_tokens=POOL_TOKENS,
        max_num_seqs=32,
        max_batched_tokens=2048,
        step_share_tokens=STEP_SHARE,
    )
    sched = Scheduler(config, make_policy("wvtc", weights=weights))
    for i, (_, requests) in enumerate(mix.heavy):
        for prompt, output in requests:
            sched.add_request(make_request(f"heavy-{i}", prompt, output), 0.0)
    queues: dict[str, list] = {f"light-{i}": [] for i in range(len(mix.light))}
    head_since: dict[str, int] = {}  # request id -> the step it reached its tenant's head
    waits: list[int] = []
    heaviest_step = 0
    for step in range(STEPS):
        now = step * 0.01
        for i, (_, every, requests) in enumerate(mix.light):
            if step % every == 0 and step // every < len(requests):
                prompt, output = requests[step // every]
                request = make_request(f"light-{i}", prompt, output, arrival_s=now)
                sched.add_request(request, now)
                queues[f"light-{i}"].append(request)
        for queue in queues.values():
            if queue and queue[0].request_id not in head_since:
                head_since[queue[0].request_id] = step
        out = fake_step(sched, now)
        if any(s.request.client.startswith("light") for s in out.scheduled):
            heavy_prompt = sum(
                s.num_new_tokens
                for s in out.scheduled
                if s.request.client.startswith("heavy") and s.num_new_tokens > 1
            )
            heaviest_step = max(heaviest_step, heavy_prompt)
        for queue in queues.values():
            while queue and queue[0].status is not RequestStatus.WAITING:
                started = queue.pop(0)  # one behind it may start in the same step
                waits.append(step - head_since.get(started.request_id, step))
    # Every light request that reached its head started (none still waiting at the end
    # beyond the bound).
    for queue in queues.values():
        if queue and queue[0].request_id in head_since:
            waits.append(STEPS - 1 - head_since[queue[0].request_id])
    return waits, heaviest_step


@settings(max_examples=60, deadline=None)
@given(mix=mixes)
def test_a_tenant_under_its_share_starts_within_a_bound_of_reaching_its_head(mix: Mix) -> None:
    config = SchedulerConfig()
    # A heavy request's life: its prompt at its tenant's part of the step (the step
    # share split among the heavy tenants and the light head), then its generation.
    tenants = len(mix.heavy) + 1
    longest_prompt = max(prompt for _, requests in mix.heavy for prompt, _ in requests)
    max_weight = max(w for w, _ in mix.heavy) + max(w for w, _, _ in mix.light)
    part = STEP_SHARE // (tenants * max_weight)
    life = -(-longest_prompt // part) + LONGEST_HEAVY_OUTPUT
    bound = config.seat_patience_steps + config.memory_patience_steps + 2 + life
    waits, heaviest_step = run_mix(mix)
    assert waits, "no light request reached its head"
    assert max(waits) <= bound, f"a light request waited {max(waits)} steps at its head"
    # The step a light request runs in carries one step share of the heavy tenants'
    # prompts, however many they are (and an eighth more: what the other tenants' chunks
    # are cut to in a step where requests start, each cut chunk keeping a token).
    assert heaviest_step <= STEP_SHARE + newcomer_chunk(STEP_SHARE) + len(mix.heavy)
