"""The static-shape decode path (CUDA graphs on a GPU) gives transformers' greedy tokens.

On CPU the same bucketed, padded steps run eagerly, so padding rows, the scratch slot
and the copies into the buckets' buffers are checked here without a GPU.
"""

from __future__ import annotations

import pytest

from .hf_models import assert_pool_free, engine_for, greedy_request, random_prompt, reference

pytestmark = pytest.mark.model


def test_static_decode_matches_generate_with_padding_and_preemption(family):
    lengths = [3, 40, 95, 300, 17]  # 5 decodes pad to the 8-row bucket; widths mix
    prompts = [random_prompt(n, seed=400 + n) for n in lengths]
    engine = engine_for(family, static_decode=True, max_batched_tokens=1024, kv_tokens=1024)
    requests = [greedy_request(f"r{i}", p, 14 + 3 * i) for i, p in enumerate(prompts)]
    for request in requests:
        assert engine.add_request(request)
    engine.run_until_done(max_steps=5000)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == reference(family, prompt, request.max_tokens)
    static = engine.executor.static_decode
    assert static is not None and static._buckets, "no step took the static decode path"
    assert {batch for batch, _ in static._buckets} <= {1, 2, 4, 8}
    assert_pool_free(engine)


def test_static_decode_is_off_on_cpu_by_default_and_with_masked_attention():
    assert engine_for("llama").executor.static_decode is None
    masked = engine_for("llama", static_decode=True, attention="masked")
    assert masked.executor.static_decode is None


def test_buckets_round_up():
    from tokenfair.engine.hf.decode_graphs import BATCH_BUCKETS, bucket_batch, bucket_width

    assert [bucket_batch(n) for n in (1, 3, 8, 9, 256)] == [1, 4, 8, 16, 256]
    assert bucket_batch(BATCH_BUCKETS[-1] + 1) is None
    assert [bucket_width(n) for n in (1, 256, 257)] == [256, 256, 512]
