"""The engine's greedy output equals transformers' generate, token for token, whatever
the batching, chunking, preemption or cancellation around it; the pool ends empty."""

from __future__ import annotations

import itertools

import pytest

from .hf_models import assert_pool_free, engine_for, greedy_request, random_prompt, reference

pytestmark = pytest.mark.model

MIXED_LENGTHS = [1, 2, 7, 16, 17, 40, 95, 160, 300]


def run(engine, requests):
    for request in requests:
        assert engine.add_request(request)
    engine.run_until_done(max_steps=5000)


def test_single_request(family):
    prompt = random_prompt(23, seed=1)
    engine = engine_for(family)
    request = greedy_request("r0", prompt, 20)
    run(engine, [request])
    assert request.output_token_ids == reference(family, prompt, 20)
    assert_pool_free(engine)


def test_mixed_batch(family):
    prompts = [random_prompt(n, seed=n) for n in MIXED_LENGTHS]
    max_tokens = [12 + (i * 5) % 17 for i in range(len(prompts))]
    engine = engine_for(family, max_batched_tokens=1024)
    requests = [
        greedy_request(f"r{i}", p, m)
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]
    run(engine, requests)
    for request, prompt, m in zip(requests, prompts, max_tokens, strict=True):
        assert request.output_token_ids == reference(family, prompt, m), request.request_id
    assert_pool_free(engine)


def test_chunked_prefill_mixes_with_decodes(family):
    """A small token budget splits long prompts into chunks that share steps with decodes."""
    prompts = [random_prompt(n, seed=100 + n) for n in (300, 5, 130, 33)]
    engine = engine_for(family, max_batched_tokens=48, enable_chunked_prefill=True)
    requests = [greedy_request(f"r{i}", p, 16) for i, p in enumerate(prompts)]
    run(engine, requests)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == reference(family, prompt, 16)
    assert_pool_free(engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_forced_preemption_mid_generation(family, mode):
    prompts = [random_prompt(n, seed=200 + n) for n in (37, 90, 12)]
    engine = engine_for(family, swap_tokens=1024 if mode == "swap" else 0, preemption=mode)
    requests = [greedy_request(f"r{i}", p, 24) for i, p in enumerate(prompts)]
    for request in requests:
        engine.add_request(request)
    for _ in range(8):
        engine.step()
    victim = requests[1]
    assert 0 < victim.num_output_tokens < 24
    engine.scheduler.force_preempt(victim.request_id, mode)
    engine.run_until_done(max_steps=5000)
    assert victim.preemptions == 1
    if mode == "swap":
        assert engine.scheduler.num_swaps == 1
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == reference(family, prompt, 24)
    assert_pool_free(engine)


def test_natural_preemption_under_memory_pressure(family):
    """A pool too small for everyone forces the scheduler to preempt on its own."""
    prompts = [random_prompt(n, seed=300 + n) for n in (60, 45, 70, 30)]
    engine = engine_for(family, kv_tokens=256, block_size=16, max_batched_tokens=256)
    requests = [greedy_request(f"r{i}", p, 40) for i, p in enumerate(prompts)]
    run(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == reference(family, prompt, 40)
    assert_pool_free(engine)


def test_abort_mid_generation(family):
    prompts = [random_prompt(n, seed=400 + n) for n in (20, 50, 8)]
    engine = engine_for(family)
    requests = [greedy_request(f"r{i}", p, 20) for i, p in enumerate(prompts)]
    for request in requests:
        engine.add_request(request)
    for _ in range(6):
        engine.step()
    aborted = requests[0]
    assert engine.abort(aborted.request_id)
    assert aborted.request_id not in engine.scheduler.kv.holders()
    engine.run_until_done(max_steps=5000)
    expected = reference(family, prompts[0], 20)
    assert aborted.output_token_ids == expected[: aborted.num_output_tokens]
    assert aborted.num_output_tokens < 20
    for request, prompt in zip(requests[1:], prompts[1:], strict=True):
        assert request.output_token_ids == reference(family, prompt, 20)
    assert_pool_free(engine)


def test_prefix_cache_hits_give_the_same_tokens():
    family = "llama"
    shared = random_prompt(64, seed=7)
    prompts = [shared + random_prompt(n, seed=500 + n) for n in (3, 20, 40)]
    engine = engine_for(family, enable_prefix_caching=True)
    run(engine, [greedy_request("warm", prompts[0], 4)])
    requests = [greedy_request(f"r{i}", p, 12) for i, p in enumerate(prompts)]
    run(engine, requests)
    assert engine.scheduler.kv.prefix_hit_tokens > 0
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == reference(family, prompt, 12)
    assert_pool_free(engine)  # cached blocks stay hashed but count as free


def test_masked_attention_mode_matches_too():
    family = "qwen2"
    prompts = [random_prompt(n, seed=600 + n) for n in (1, 33, 120)]
    engine = engine_for(family, attention="masked", max_batched_tokens=64)
    requests = [greedy_request(f"r{i}", p, 10) for i, p in enumerate(prompts)]
    run(engine, requests)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == reference(family, prompt, 10)
    assert_pool_free(engine)


def test_sliding_window_model_matches_generate():
    """Mistral attends within a window: contexts longer than it must be cut the same way."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    from tokenfair.engine.hf.factory import make_hf_engine
    from tokenfair.engine.hf.loader import LoadedModel

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=24,
    )
    model = MistralForCausalLM(config).eval()
    prompts = [random_prompt(n, seed=700 + n) for n in (5, 30, 90)]
    expected = []
    for prompt in prompts:
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        expected.append(out[0, len(prompt) :].tolist())
    engine = make_hf_engine(
        LoadedModel("mistral", model, None), kv_tokens=2048, max_batched_tokens=40
    )
    requests = [greedy_request(f"r{i}", p, 20) for i, p in enumerate(prompts)]
    run(engine, requests)
    assert [r.output_token_ids for r in requests] == expected
    assert_pool_free(engine)


def test_decode_groups_bound_padding():
    from tokenfair.engine.hf.step_layout import GROUP_SPREAD, MAX_GROUPS, _split_groups

    lens = sorted([600, 590, 420, 400, 390, 260, 100, 99, 40, 17, 3, 1], reverse=True)
    groups = _split_groups(lens)
    assert groups[0][0] == 0 and groups[-1][1] == len(lens) and len(groups) <= MAX_GROUPS
    for (_, end), (begin, _) in itertools.pairwise(groups):
        assert end == begin
    for begin, end in groups[:-1]:
        assert lens[begin] <= GROUP_SPREAD * lens[end - 1]
    assert _split_groups([]) == [] and _split_groups([5]) == [(0, 1)]
