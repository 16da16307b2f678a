"""What a tenant holds, inside vLLM's real Scheduler: memory taken for a waiting request,
every blocked head letting tenants within their share pass, and the step's prompt
tokens shared among tenants (integrations/vllm/memory_share.py, step_share.py)."""

from __future__ import annotations

from tests.integrations.vllm.harness import add, make_request, make_scheduler, new_ids, step
from tokenfair.core.step_share import newcomer_chunk
from tokenfair.integrations.vllm import FairScheduler


def steps_until_started(scheduler, request_id: str, limit: int = 200) -> int:
    for steps in range(1, limit):
        if request_id in new_ids(step(scheduler)):
            return steps
    return limit


def test_memory_is_taken_from_a_tenant_over_its_entitlement_for_one_within_its_own(
    tiny_model_dir,
):
    # `a` runs four requests (36 of the pool's 47 blocks); `b`'s request needs 16, more
    # than is free, and keeps `b` within its entitlement (half the pool). `a`'s newest
    # request gives its memory up (recomputed later), and `b`'s starts at once; without
    # it, `b` waits for `a`'s generations to end.
    def run(share_memory: bool) -> tuple[int, int]:
        scheduler = make_scheduler(
            tiny_model_dir,
            FairScheduler,
            num_blocks=48,
            max_num_seqs=8,
            tokenfair={"w_in": 0.1, "share_memory": share_memory},
        )
        add(scheduler, [make_request(scheduler, f"a{i}", "a", 128, 40) for i in range(4)])
        step(scheduler)
        step(scheduler)
        pool = scheduler.kv_cache_manager.block_pool
        add(scheduler, [make_request(scheduler, "b0", "b", 256, 8)])
        assert pool.get_num_free_blocks() < 16  # b0 does not fit
        waited = steps_until_started(scheduler, "b0")
        return waited, scheduler.driver.tenants()["a"].preemptions

    waited, preempted = run(share_memory=True)
    assert waited == 1
    assert preempted == 1  # one request of `a`, not more
    assert run(share_memory=False)[0] > 20


def test_a_blocked_head_lets_a_light_tenant_pass_though_another_tenant_holds_more(
    tiny_model_dir,
):
    # `a` holds the most (three requests), `c` less (one request) and `c`'s next
    # request, the policy's head (prompts are all `c` was charged), does not fit. `c`
    # is not the tenant asking the most of the pool, and `a` would be left holding less
    # than `c` if it gave memory: nobody is pushed out. The light tenant `b` is within
    # its share and starts at once: every head that cannot start lets it pass.
    scheduler = make_scheduler(
        tiny_model_dir,
        FairScheduler,
        num_blocks=48,
        max_num_seqs=8,
        tokenfair={"w_out": 0.0},
    )
    add(scheduler, [make_request(scheduler, "b0", "b", 200, 2)])
    while scheduler.has_requests():
        step(scheduler)
    add(scheduler, [make_request(scheduler, f"a{i}", "a", 128, 40) for i in range(3)])
    add(scheduler, [make_request(scheduler, "c0", "c", 128, 40)])
    step(scheduler)
    step(scheduler)
    add(scheduler, [make_request(scheduler, "c1", "c", list(range(300, 492)), 4)])
    add(scheduler, [make_request(scheduler, "b1", "b", 16, 4)])
    assert scheduler.driver.peek().request_id == "c1"  # the head, and it does not fit
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() < 12
    assert steps_until_started(scheduler, "b1") == 1
    assert "c1" in scheduler.driver  # still waiting
    assert all(s.preemptions == 0 for s in scheduler.driver.tenants().values())


def prompt_tokens_by_tenant(scheduler, output) -> dict[str, int]:
    """Each tenant's prompt tokens in the step (chunks of more than one token)."""
    tokens: dict[str, int] = {}
    for request_id, n in output.num_scheduled_tokens.items():
        if n > 1:
            tenant = scheduler.driver.tenant_of(request_id)
            tokens[tenant] = tokens.get(tenant, 0) + n
    return tokens


def test_long_prompt_tenants_share_one_step_share_by_weight(tiny_model_dir):
    # Two tenants prefill long prompts beside a chat tenant decoding: their chunks
    # take the step's share once together, 2:1 by weight, and the chat request decodes
    # in every step. Without the share, vLLM runs a whole prompt in one step.
    def steps(step_share: int | None) -> list[dict[str, int]]:
        scheduler = make_scheduler(
            tiny_model_dir,
            FairScheduler,
            num_blocks=512,
            max_num_seqs=8,
            tokenfair={"weights": {"long-a": 2.0}, "step_share_tokens": step_share},
        )
        add(scheduler, [make_request(scheduler, "chat", "chat", 16, 60)])
        step(scheduler)
        longs = [make_request(scheduler, f"{t}-0", t, 1800, 4) for t in ("long-a", "long-b")]
        add(scheduler, longs)
        planned = []
        for _ in range(3):
            output = step(scheduler)
            assert "chat" in output.num_scheduled_tokens  # the decode goes on
            planned.append(prompt_tokens_by_tenant(scheduler, output))
        return planned

    shared = steps(768)
    assert all(sum(p.values()) <= 768 for p in shared)
    assert shared[-1] == {"long-a": 512, "long-b": 256}
    assert max(sum(p.values()) for p in steps(None)) > 768


def test_a_starting_request_cuts_the_steps_other_prompt_chunks(tiny_model_dir):
    # Long prompts prefill; a chat request arrives: the step that starts it runs its
    # whole prompt and cuts the long chunks to an eighth of the share together, so its
    # first token comes out of a short step.
    def starting_step(step_share: int) -> dict[str, int]:
        scheduler = make_scheduler(
            tiny_model_dir,
            FairScheduler,
            num_blocks=512,
            max_num_seqs=8,
            tokenfair={"step_share_tokens": step_share},
        )
        add(scheduler, [make_request(scheduler, f"{t}-0", t, 1800, 4) for t in ("la", "lb")])
        step(scheduler)
        step(scheduler)
        add(scheduler, [make_request(scheduler, "chat-0", "chat", 48, 4)])
        return prompt_tokens_by_tenant(scheduler, step(scheduler))

    planned = starting_step(768)
    assert planned["chat"] == 48  # its whole prompt
    # The long prompts go on, in an eighth of the share together (not their parts of
    # it, 256 each beside the chat tenant's).
    assert 0 < planned["la"] + planned["lb"] <= newcomer_chunk(768)
