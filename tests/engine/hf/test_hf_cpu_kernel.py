"""The engine's CPU fast paths. The decode-attention kernel equals softmax attention
over each request's own context (grouped-query heads, sliding windows, any block size
and head size, queries read through strides); packed linear layers equal the dense
ones; the engine gives transformers' tokens with and without them, and falls back to
torch where the kernel cannot be built or the fast paths are switched off."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from tokenfair.engine.hf.cpu_kernels import paged_decode_kernel  # noqa: E402
from tokenfair.engine.hf.cpu_linear import PackedLinear, pack_linear_layers  # noqa: E402
from tokenfair.engine.hf.factory import make_hf_engine  # noqa: E402
from tokenfair.engine.hf.loader import LoadedModel  # noqa: E402

from .hf_models import assert_pool_free, greedy_request, random_prompt, tiny_model  # noqa: E402
from .hf_models import reference as transformers_greedy  # noqa: E402

pytestmark = pytest.mark.model
SRC = str(Path(__file__).resolve().parents[3] / "src")


def softmax_attention(query, keys, values, tables, lens, block_size, scale, window):
    """Attention in float64, one request at a time, written from the definition."""
    kv_heads = keys.shape[0]
    group = query.shape[1] // kv_heads
    out = torch.empty(query.shape, dtype=torch.float64)
    for r in range(query.shape[0]):
        length = int(lens[r])
        positions = torch.arange(length)
        if window:
            positions = positions[max(0, length - window) :]
        slots = tables[r, positions // block_size] * block_size + positions % block_size
        for h in range(query.shape[1]):
            k = keys[h // group, slots].double()
            v = values[h // group, slots].double()
            weights = torch.softmax(k @ query[r, h].double() * scale, dim=0)
            out[r, h] = weights @ v
    return out


needs_kernel = pytest.mark.skipif(paged_decode_kernel() is None, reason="no CPU kernel built")


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(
    requests=st.integers(1, 7),
    kv_heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 13, 64, 80, 128]),
    block_size=st.sampled_from([1, 4, 16]),
    window=st.one_of(st.none(), st.integers(1, 40)),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_kernel_equals_softmax_attention(
    requests, kv_heads, group, head_dim, block_size, window, threads, seed
):
    generator = torch.Generator().manual_seed(seed)
    heads, num_blocks = kv_heads * group, 64
    lens = torch.randint(1, 120, (requests,), generator=generator)
    max_blocks = -(-int(lens.max()) // block_size)
    # Shuffled blocks, each request's own: contexts lie anywhere in the pool.
    blocks = torch.randperm(max(num_blocks, requests * max_blocks), generator=generator)
    tables = blocks[: requests * max_blocks].view(requests, max_blocks)
    slots = int(blocks.numel()) * block_size
    keys = torch.randn(kv_heads, slots, head_dim, generator=generator)
    values = torch.randn(kv_heads, slots, head_dim, generator=generator)
    # The model's query layout: [1, heads, tokens, head_dim], decodes first, viewed strided.
    packed = torch.randn(1, heads, requests + 3, head_dim, generator=generator)
    query = packed[0, :, :requests].transpose(0, 1)
    scale = head_dim**-0.5

    kernel = paged_decode_kernel()
    got = kernel(query, keys, values, tables, lens, block_size, scale, window, threads=threads)
    expected = softmax_attention(query, keys, values, tables, lens, block_size, scale, window)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_kernel_refuses_what_it_cannot_read():
    kernel = paged_decode_kernel()
    keys = torch.zeros(2, 32, 8)
    tables = torch.zeros(1, 2, dtype=torch.long)
    lens = torch.tensor([3])
    with pytest.raises(ValueError, match="float32"):
        kernel(torch.zeros(1, 2, 8, dtype=torch.float64), keys, keys, tables, lens, 16, 1.0)
    with pytest.raises(ValueError, match="int64"):
        kernel(torch.zeros(1, 2, 8), keys, keys, tables.int(), lens, 16, 1.0)
    with pytest.raises(ValueError, match="pool views"):
        kernel(torch.zeros(1, 2, 8), keys, keys.transpose(1, 2).contiguous(), tables, lens, 16, 1.0)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_the_kernel_builds_where_a_compiler_is_found():
    assert paged_decode_kernel() is not None


MIXED = (1, 7, 16, 17, 40, 95, 160)


@pytest.mark.parametrize("fast", [None, False], ids=["fast-paths", "plain-torch"])
def test_engine_tokens_match_transformers_either_way(fast):
    family = "llama"
    model = tiny_model.__wrapped__(family)  # a fresh copy: the engine may pack it
    engine = make_hf_engine(
        LoadedModel(family, model, None),
        kv_tokens=4096,
        max_batched_tokens=1024,
        decode_kernel=fast,
        pack_linear=fast,
    )
    kernel_built = paged_decode_kernel() is not None
    assert engine.executor.decode_kernel == ("c" if kernel_built and fast is None else None)
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    assert (packed > 0) is (fast is None) and packed == engine.executor.packed_linear_layers
    prompts = [random_prompt(n, seed=900 + n) for n in MIXED]
    requests = [greedy_request(f"r{i}", p, 14) for i, p in enumerate(prompts)]
    for request in requests:
        assert engine.add_request(request)
    engine.run_until_done(max_steps=5000)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_token_ids == transformers_greedy(family, prompt, 14)
    assert_pool_free(engine)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied-embeddings"])
def test_packed_linear_layers_equal_the_dense_ones(tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    dense = LlamaForCausalLM(config).eval()
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(dense.state_dict())
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert pack_linear_layers(model) == linears == 2 * 7 + 1
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    if tied:  # the embedding keeps its dense weight; the output layer reads a packed copy
        assert model.model.embed_tokens.weight.layout == torch.strided
    ids = torch.randint(0, 300, (2, 9))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, dense(ids).logits, rtol=1e-4, atol=1e-4)


def test_switched_off_fast_paths_pack_nothing(monkeypatch):
    monkeypatch.setenv("TOKENFAIR_CPU_KERNELS", "0")
    model = tiny_model.__wrapped__("llama")
    assert pack_linear_layers(model) == 0
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_forcing_the_kernel_where_it_does_not_apply_is_an_error():
    with pytest.raises(ValueError, match="paged attention"):
        make_hf_engine(
            LoadedModel("llama", tiny_model("llama"), None), kv_tokens=512, decode_kernel=True,
            attention="masked",
        )  # fmt: skip


def _kernel_in_fresh_process(**env: str) -> str:
    """'True|<log>' when a new process gets the kernel (the executor uses it whenever
    it is there: test_engine_tokens_match_transformers_either_way), 'False|<log>' not."""
    probe = (
        "from tokenfair.engine.hf.cpu_kernels import paged_decode_kernel\n"
        "print(paged_decode_kernel() is not None)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": SRC, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1] + "|" + result.stderr


def test_switched_off_by_environment(tmp_path):
    out = _kernel_in_fresh_process(TOKENFAIR_CPU_KERNELS="0", TOKENFAIR_CACHE_DIR=str(tmp_path))
    assert out.startswith("False|")
    assert not list(tmp_path.rglob("*.so")), "nothing is built when the kernel is off"


def test_falls_back_to_torch_without_a_compiler(tmp_path):
    out = _kernel_in_fresh_process(
        CC=str(tmp_path / "no-such-cc"), TOKENFAIR_CACHE_DIR=str(tmp_path)
    )
    verdict, log = out.split("|", 1)
    assert verdict == "False"
    assert "CPU kernels unavailable" in log


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_a_built_kernel_is_cached(tmp_path):
    first = _kernel_in_fresh_process(TOKENFAIR_CACHE_DIR=str(tmp_path))
    built = list(tmp_path.rglob("*.so"))
    assert first.startswith("True|") and len(built) == 1
    stamp = built[0].stat()
    again = _kernel_in_fresh_process(TOKENFAIR_CACHE_DIR=str(tmp_path))
    assert again.startswith("True|") and list(tmp_path.rglob("*.so")) == built
    after = built[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns), "rebuilt"
