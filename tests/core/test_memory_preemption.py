"""Memory preemption retries only the request that was short; admission looks before it
takes. Each test pins the plan a step ends with, not just that the run finishes."""

from __future__ import annotations

import random

import pytest

from tokenfair.core.policies import make_policy
from tokenfair.core.request import RequestStatus
from tokenfair.core.scheduler import Scheduler, SchedulerConfig

from .helpers import fake_step, make_request
from .test_kv_cache import computed, grouped, kv_state


def scripted(scheduler: Scheduler, rank: dict[str, float]) -> list[str]:
    """Make the memory victim the running request of highest `rank`; return the list
    the victims' ids are appended to."""
    victims: list[str] = []

    def victim(running):
        chosen = max(running, key=lambda r: rank.get(r.request_id, 0))
        victims.append(chosen.request_id)
        return chosen

    scheduler.contention.shortage_victim = victim  # type: ignore[method-assign]
    return victims


def looked_at(scheduler: Scheduler) -> list[str]:
    """Record each request whose block table the step's planning reads, in order."""
    seen: list[str] = []
    table_of = scheduler.kv.block_table

    def recording(request_id: str) -> list[int]:
        seen.append(request_id)
        return table_of(request_id)

    scheduler.kv.block_table = recording
    return seen


def hog(scheduler: Scheduler, blocks: int) -> None:
    """Take `blocks` blocks of the pool for a request outside the scheduler."""
    kv = scheduler.kv
    filler = make_request(input_tokens=1)
    assert kv.allocate(filler, blocks * kv.block_size) is not None


def test_only_the_short_request_is_retried_and_a_planned_victim_leaves_the_plan():
    config = SchedulerConfig(kv_tokens=64, block_size=4, max_num_seqs=8, max_batched_tokens=64)
    scheduler = Scheduler(config, make_policy("fcfs"))
    r = [make_request(request_id=f"q{i}", input_tokens=4, output_tokens=50) for i in range(8)]
    for request in r:
        scheduler.add_request(request, 0)
    fake_step(scheduler, 0)  # all 8 prefilled: 1 block each, 5 tokens to hold next
    hog(scheduler, 8)  # nothing free: every request is short of its second block
    # q0 short: q5 (not planned yet) goes, q0 is retried and fits. q1 short: q0 (planned)
    # goes and gives its token back; q1 fits, and q0's second block leaves one for q2.
    # q3 short: q3 itself goes and planning moves on; its block serves q4. q6 short:
    # q7 goes and q6 fits.
    victims = scripted(scheduler, {"q5": 4, "q0": 3, "q3": 2, "q7": 1})
    seen = looked_at(scheduler)
    out = scheduler.schedule(1.0)
    assert victims == ["q5", "q0", "q3", "q7"]
    assert [(s.request.request_id, s.num_new_tokens, s.start) for s in out.scheduled] == [
        ("q1", 1, 4),
        ("q2", 1, 4),
        ("q4", 1, 4),
        ("q6", 1, 4),
    ]
    # Each request is planned once; only a short one is looked at again, once per retry.
    assert seen == ["q0", "q0", "q1", "q1", "q2", "q3", "q4", "q6", "q6"]
    assert [x.request_id for x in scheduler.running] == ["q1", "q2", "q4", "q6"]
    assert all(r[int(v[1])].status is RequestStatus.PREEMPTED for v in victims)
    assert scheduler.num_memory_preemptions == 4
    kv = scheduler.kv
    assert kv.num_free_blocks == 0
    for s in out.scheduled:
        assert len(kv.block_table(s.request.request_id)) * 4 >= s.start + s.num_new_tokens
    kv.check_invariants()


def test_a_planned_victims_tokens_go_back_to_the_short_requests_chunk():
    config = SchedulerConfig(kv_tokens=64, block_size=4, max_num_seqs=4, max_batched_tokens=10)
    scheduler = Scheduler(config, make_policy("fcfs"))
    decode = make_request(request_id="d", input_tokens=4, output_tokens=50)
    prefill = make_request(request_id="p", input_tokens=30, output_tokens=5)
    scheduler.add_request(decode, 0)
    scheduler.add_request(prefill, 0)
    fake_step(scheduler, 0)  # d's prompt (1 block), then a 6-token chunk of p (2 blocks)
    assert prefill.num_computed_tokens == 6
    hog(scheduler, scheduler.kv.num_free_blocks - 1)  # one block left
    # d takes the last block for its token; p's 9-token chunk (to 15) needs 2 more: short.
    # d goes, and p is retried with d's token back: a 10-token chunk.
    victims = scripted(scheduler, {"d": 1})
    out = scheduler.schedule(1.0)
    assert victims == ["d"]
    assert [(s.request.request_id, s.num_new_tokens, s.start) for s in out.scheduled] == [
        ("p", 10, 6)
    ]
    scheduler.kv.check_invariants()


def reference_plan(
    running: list, held: dict[str, int], free: int, block_size: int, rank: dict[str, float]
) -> tuple[list[str], list[str], list[str]]:
    """vLLM v1's loop on block counts alone (decode steps, budget to spare): each running
    request in order takes the blocks its next tokens need; when the pool is short the
    highest-ranked running request is preempted (its blocks freed, its plan entry
    dropped) and the short request tried again, unless it was the victim. Returns the
    plan, the victims and every request tried, in order."""
    running, held = list(running), dict(held)
    plan: list[str] = []
    victims: list[str] = []
    tried: list[str] = []
    i = 0
    while i < len(running):
        request = running[i]
        rid = request.request_id
        tried.append(rid)
        need = max(0, -(-request.num_tokens // block_size) - held[rid])
        if need <= free:
            free -= need
            held[rid] += need
            plan.append(rid)
            i += 1
            continue
        victim = max(running, key=lambda r: rank[r.request_id])
        victims.append(victim.request_id)
        free += held[victim.request_id]
        if victim.request_id in plan:
            plan.remove(victim.request_id)
        at = running.index(victim)
        running.remove(victim)
        if at < i:
            i -= 1
    return plan, victims, tried


@pytest.mark.parametrize("seed", range(30))
def test_repeated_memory_preemptions_match_the_reference_loop(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2])
    config = SchedulerConfig(
        kv_tokens=8192, block_size=block_size, max_num_seqs=64, max_batched_tokens=8192
    )
    scheduler = Scheduler(config, make_policy("fcfs"))
    requests = [
        make_request(
            request_id=f"q{i}", input_tokens=rng.randint(1, 12), output_tokens=rng.randint(8, 40)
        )
        for i in range(rng.randint(5, 40))
    ]
    for request in requests:
        scheduler.add_request(request, 0)
    for step in range(rng.randint(1, 6)):
        fake_step(scheduler, step)
    kv = scheduler.kv
    hog(scheduler, kv.num_free_blocks - rng.randint(0, 1))  # at most 1 block free
    rank = {r.request_id: rng.random() for r in requests}
    before = list(scheduler.running)
    held = {r.request_id: len(kv.block_table(r.request_id)) for r in before}
    plan, expected_victims, tried = reference_plan(
        before, held, kv.num_free_blocks, block_size, rank
    )
    assert expected_victims, "the test must preempt"
    victims = scripted(scheduler, rank)
    seen = looked_at(scheduler)
    out = scheduler.schedule(10.0)
    assert victims == expected_victims
    # The running requests' plan; admission may then let victims back in (from 0).
    steps = [s for s in out.scheduled if s.start > 0]
    admitted = [s.request.request_id for s in out.scheduled if s.start == 0]
    assert [s.request.request_id for s in steps] == plan
    assert out.scheduled[: len(steps)] == steps
    assert all(s.num_new_tokens == 1 for s in steps)  # decode steps
    assert seen == tried  # planned once each, retried only while short
    assert [r.request_id for r in scheduler.running] == plan + admitted
    for s in out.scheduled:
        held_now = len(kv.block_table(s.request.request_id))
        assert held_now * block_size >= s.start + s.num_new_tokens
    kv.check_invariants()


def test_admission_looks_up_the_prefix_and_takes_it_only_with_the_request():
    config = SchedulerConfig(
        kv_tokens=32, block_size=4, max_num_seqs=4, max_batched_tokens=64,
        enable_prefix_caching=True,
    )  # fmt: skip
    scheduler = Scheduler(config, make_policy("fcfs"))
    kv = scheduler.kv
    first = grouped(12, "g", 12)
    computed(kv, first, 12)
    kv.free(first)  # 3 idle cached blocks of g
    other = grouped(5, "o", 4)
    computed(kv, other, 5)
    kv.free(other)  # and 1 of o, freed after them: the LRU evicts g's first
    filler = make_request(input_tokens=1)
    assert kv.allocate(filler, 16) is not None  # 4 free: the 4 cached blocks
    waiting = grouped(20, "g", 12, output_tokens=3)
    scheduler.add_request(waiting, 0)
    # 3 cached blocks (all idle) + 2 new for tokens 12..19: 5 > 4 free. Without the
    # idle blocks counted it would fit, and evict its own prefix to make room.
    hit = kv.lookup_prefix(waiting)
    before = kv_state(kv)
    out = scheduler.schedule(0.0)
    assert out.scheduled == [] and scheduler.num_waiting == 1
    after = kv_state(kv)
    # Nothing taken; only the LRU order moved: the refused head is next in line, so its
    # prefix blocks are now the most recently used, o's block the next to evict.
    lru = 5  # kv_state's index of the evictable LRU
    assert after[:lru] + after[lru + 1 :] == before[:lru] + before[lru + 1 :]
    o_block = before[lru][-1]
    assert before[lru] == [*reversed(hit.blocks), o_block]
    assert after[lru] == [o_block, *reversed(hit.blocks)]
    assert waiting.num_computed_tokens == 0 and waiting.request_id not in kv.holders()
    assert kv.prefix_query_tokens == 0
    kv.free(filler)
    out = scheduler.schedule(1.0)
    assert [(s.request, s.start, s.num_new_tokens) for s in out.scheduled] == [(waiting, 12, 8)]
    assert waiting.num_computed_tokens == 12 and waiting.cached_tokens == 12
    assert out.scheduled[0].block_ids == kv.block_table(waiting.request_id)
    assert kv.block_table(waiting.request_id)[:3] == list(hit.blocks)
    assert (kv.prefix_hit_tokens, kv.prefix_query_tokens) == (12, 20)
    kv.check_invariants()
