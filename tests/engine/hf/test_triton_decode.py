"""The GPU decode-attention kernel (Triton), run by Triton's interpreter on the CPU:
it equals softmax attention over each request's own context, read from the pool
through block tables (grouped-query heads, sliding windows, contexts split over
several partitions, an empty window), with queries read through strides."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("triton")  # installed by `make test` (the dev extra)

from tokenfair.engine.hf.factory import make_hf_engine  # noqa: E402
from tokenfair.engine.hf.loader import LoadedModel  # noqa: E402
from tokenfair.engine.hf.triton_decode import paged_decode, partitions_for  # noqa: E402

from .hf_models import FAMILIES, assert_pool_free, greedy_request, random_prompt, tiny_model  # noqa: E402
from .hf_models import reference as transformers_greedy  # noqa: E402
from .test_hf_cpu_kernel import softmax_attention  # noqa: E402

pytestmark = pytest.mark.model


def pool_and_tables(requests, kv_heads, head_dim, block_size, lens, generator):
    max_blocks = -(-int(lens.max()) // block_size)
    blocks = torch.randperm(requests * max_blocks + 3, generator=generator)
    tables = blocks[: requests * max_blocks].view(requests, max_blocks).contiguous()
    slots = int(blocks.numel()) * block_size
    keys = torch.randn(kv_heads, slots, head_dim, generator=generator)
    values = torch.randn(kv_heads, slots, head_dim, generator=generator)
    return keys, values, tables


@settings(max_examples=12, deadline=None)
@given(
    requests=st.integers(1, 4),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 64, 80]),
    block_size=st.sampled_from([16, 32, 64]),
    window=st.one_of(st.none(), st.integers(1, 300)),
    longest=st.integers(1, 600),
    seed=st.integers(0, 2**16),
)
def test_the_triton_kernel_equals_softmax_attention(
    requests, kv_heads, group, head_dim, block_size, window, longest, seed
):
    generator = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    lens = torch.randint(1, longest + 1, (requests,), generator=generator)
    keys, values, tables = pool_and_tables(
        requests, kv_heads, head_dim, block_size, lens, generator
    )
    # The model's query layout: [1, heads, tokens, head_dim], viewed strided.
    packed = torch.randn(1, heads, requests + 2, head_dim, generator=generator)
    query = packed[0, :, :requests].transpose(0, 1)
    scale = head_dim**-0.5
    out = paged_decode(
        query, keys, values, tables, lens, block_size, scale, window,
        partitions=partitions_for(int(lens.max())),
    )  # fmt: skip
    expected = softmax_attention(query, keys, values, tables, lens, block_size, scale, window)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


def test_more_partitions_than_the_context_needs_change_nothing():
    """A graph bucket fixes the partitions for its widest context; shorter ones leave
    the last partitions empty, which must weigh nothing."""
    generator = torch.Generator().manual_seed(7)
    lens = torch.tensor([300, 5, 1])
    keys, values, tables = pool_and_tables(3, 2, 64, 16, lens, generator)
    query = torch.randn(3, 4, 64, generator=generator)
    args = (query, keys, values, tables, lens, 16, 0.125)
    tight = paged_decode(*args, partitions=partitions_for(300))
    loose = paged_decode(*args, partitions=partitions_for(300) + 3)
    torch.testing.assert_close(tight, loose)
    expected = softmax_attention(query, keys, values, tables, lens, 16, 0.125, None)
    torch.testing.assert_close(loose.double(), expected, rtol=1e-4, atol=1e-4)


def test_an_empty_window_attends_to_nothing():
    generator = torch.Generator().manual_seed(3)
    lens = torch.tensor([0, 20])
    keys, values, tables = pool_and_tables(2, 1, 16, 16, torch.tensor([20, 20]), generator)
    out = paged_decode(torch.randn(2, 1, 16), keys, values, tables, lens, 16, 0.25)
    assert torch.count_nonzero(out[0]) == 0 and torch.count_nonzero(out[1]) > 0


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static-buckets"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_with_the_triton_kernel_gives_transformers_tokens(family, static):
    """The whole engine path a GPU takes (block tables shipped with the step, static
    buckets padding into the scratch block), the kernel interpreted on the CPU."""
    engine = make_hf_engine(
        LoadedModel(family, tiny_model.__wrapped__(family), None),
        kv_tokens=2048,
        max_batched_tokens=256,
        decode_kernel="triton",
        static_decode=static,
    )
    assert engine.executor.decode_kernel == "triton"
    prompts = [random_prompt(n, seed=700 + n) for n in (3, 17, 40)]
    requests = [greedy_request(f"r{i}", p, 6) for i, p in enumerate(prompts)]
    for request in requests:
        assert engine.add_request(request)
    engine.run_until_done(max_steps=500)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == transformers_greedy(family, prompt, 6)
    assert_pool_free(engine)
    static_decode = engine.executor.static_decode
    assert (static_decode is not None and static_decode.buckets != []) is static


def test_asking_for_the_triton_kernel_where_it_cannot_run_is_an_error():
    with pytest.raises(ValueError, match="power-of-two block size"):
        make_hf_engine(
            LoadedModel("llama", tiny_model("llama"), None),
            kv_tokens=512, block_size=8, decode_kernel="triton",
        )  # fmt: skip
    with pytest.raises(ValueError, match="paged attention"):
        make_hf_engine(
            LoadedModel("llama", tiny_model("llama"), None),
            kv_tokens=512, attention="masked", decode_kernel="triton",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("asked", "used"), [(None, "c"), ("torch", None), ("c", "c"), ("triton", "triton")]
)
def test_the_servers_decode_kernel_option_reaches_the_engine(asked, used):
    from tokenfair.core.policies import make_policy
    from tokenfair.engine.backends import backend_for

    built = backend_for("builtin:tiny").build(
        "builtin:tiny", make_policy("fcfs"), kv_tokens=512, device="cpu", decode_kernel=asked
    )
    assert built.engine.executor.decode_kernel == used
