"""The CPU row kernels and the layers built on them: each kernel equals the operation
transformers writes (RMS norm, SiLU-gated product, rotate-half rotary embedding) on rows
read through strides, on one thread and split among threads; a model's layers on them
give the logits it gave before; layers that compute something else keep their code; the
rotary function takes the kernel only inside an engine step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import transformers.models.llama.modeling_llama as modeling_llama  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from tokenfair.engine.hf import cpu_row_ops  # noqa: E402
from tokenfair.engine.hf.cpu_kernels import row_kernels  # noqa: E402
from tokenfair.engine.hf.cpu_row_ops import (  # noqa: E402
    RowKernelGatedMLP,
    RowKernelRMSNorm,
    RowKernelRotary,
    engine_step,
    fuse_row_ops,
)

from .hf_models import dense_model  # noqa: E402

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(row_kernels() is None, reason="no CPU kernels built"),
]

# Rows x width past which a kernel splits its rows among threads (row_ops.c).
PARALLEL_ELEMENTS = 1 << 18


def rows_of(rows: int, width: int, spare: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    """A [rows, width] view of a wider matrix (row stride width + spare)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width + spare, generator=g) * scale)[
        :, spare // 2 : spare // 2 + width
    ]


def close(got: torch.Tensor, expected: torch.Tensor, tolerance: float = 2e-6) -> bool:
    scale = expected.abs().max().clamp_min(1.0)
    return got.shape == expected.shape and bool((got - expected).abs().max() <= tolerance * scale)


def torch_rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 70),
    dim=st.integers(1, 300),
    spare=st.integers(0, 9),
    seed=st.integers(0, 1000),
)
def test_rms_norm_is_transformers_rms_norm(rows, dim, spare, seed):
    x = rows_of(rows, dim, spare, seed)
    weight = torch.randn(dim, generator=torch.Generator().manual_seed(seed + 1))
    assert close(row_kernels().rms_norm(x, weight, 1e-6), torch_rms_norm(x, weight, 1e-6))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 70),
    width=st.integers(1, 300),
    seed=st.integers(0, 1000),
    scale=st.sampled_from([1.0, 10.0, 100.0]),
)
def test_silu_and_mul_is_silu_times_up(rows, width, seed, scale):
    # gate and up as the two halves of one stacked projection's output, as a model has them
    stacked = rows_of(rows, 2 * width, 0, seed, scale)
    gate, up = stacked[:, :width], stacked[:, width:]
    assert close(row_kernels().silu_and_mul(gate, up), F.silu(gate) * up)


def original_rotary():
    """transformers' function, whether or not an engine has wrapped the module's."""
    function = modeling_llama.apply_rotary_pos_emb
    return function.original if isinstance(function, RowKernelRotary) else function


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(1, 40),
    heads=st.integers(1, 6),
    half=st.integers(1, 70),
    seed=st.integers(0, 1000),
)
def test_rotary_is_transformers_rotate_half(tokens, heads, half, seed):
    dim = 2 * half
    g = torch.Generator().manual_seed(seed)
    # queries as the model has them: a [tokens, heads * dim] projection seen as [heads, tokens, dim]
    x = torch.randn(tokens, heads * dim + 3, generator=g)[:, 1 : 1 + heads * dim]
    x = x.view(tokens, heads, dim)
    cos, sin = torch.randn(2, tokens, dim, generator=g).unbind(0)
    q = x.transpose(0, 1)[None]
    expected, _ = original_rotary()(q, q, cos[None], sin[None])
    got = row_kernels().rotary(x, cos, sin).transpose(0, 1)[None]
    assert close(got, expected)


def test_big_inputs_are_split_among_threads_and_give_the_same():
    rows, dim = PARALLEL_ELEMENTS // 64 + 7, 64  # past the threshold, a ragged last chunk
    kernels = row_kernels()
    x = rows_of(rows, dim, 4, 0)
    weight = torch.randn(dim)
    assert close(kernels.rms_norm(x, weight, 1e-5), torch_rms_norm(x, weight, 1e-5))
    stacked = rows_of(rows, 2 * dim, 0, 1)
    gate, up = stacked[:, :dim], stacked[:, dim:]
    assert close(kernels.silu_and_mul(gate, up), F.silu(gate) * up)
    heads = 4
    x = torch.randn(rows, heads, dim)
    cos, sin = torch.randn(2, rows, dim).unbind(0)
    expected, _ = original_rotary()(
        x.transpose(0, 1)[None], x[:, :1].transpose(0, 1)[None], cos[None], sin[None]
    )
    assert close(kernels.rotary(x, cos, sin), expected[0].transpose(0, 1))


def test_bad_shapes_are_refused_with_a_reason():
    kernels = row_kernels()
    with pytest.raises(ValueError, match="unit stride"):
        kernels.rms_norm(torch.randn(4, 8).t(), torch.randn(4), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        kernels.rms_norm(torch.randn(4, 8), torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="differ"):
        kernels.silu_and_mul(torch.randn(4, 8), torch.randn(4, 9))
    with pytest.raises(ValueError, match="dim even"):
        kernels.rotary(torch.randn(4, 2, 7), torch.randn(4, 7), torch.randn(4, 7))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_model_on_row_kernels_gives_the_logits_it_gave(family):
    model = dense_model(family)
    ids = torch.randint(1, 500, (1, 37), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        before = model(ids).logits
    swapped = _copy(model)
    count = fuse_row_ops(swapped)
    layers = len(swapped.model.layers)
    assert count == 2 * layers + 1 + layers + 1  # norms, the final norm, MLPs, rotary
    assert isinstance(swapped.model.norm, RowKernelRMSNorm)
    assert all(isinstance(layer.mlp, RowKernelGatedMLP) for layer in swapped.model.layers)
    with torch.inference_mode(), engine_step():
        after = swapped(ids).logits
    assert close(after, before, 1e-5)
    # the weights are where they were, once each
    assert swapped.state_dict().keys() == model.state_dict().keys()


def _copy(model):
    import copy

    return copy.deepcopy(model)


class OnePlusWeightRMSNorm(nn.Module):
    """Gemma's variant: the weight is added to one. Not the row kernel's norm."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return torch_rms_norm(x, 1.0 + self.weight, self.variance_epsilon)


class PlainRMSNorm(OnePlusWeightRMSNorm):
    def forward(self, x):
        return torch_rms_norm(x, self.weight, self.variance_epsilon)


def test_a_layer_that_computes_something_else_keeps_its_code():
    model = nn.Sequential(OnePlusWeightRMSNorm(32), PlainRMSNorm(32))
    assert fuse_row_ops(model) == 1
    assert type(model[0]) is OnePlusWeightRMSNorm
    assert type(model[1]) is RowKernelRMSNorm


def test_inputs_the_kernels_do_not_take_go_to_the_original_code():
    norm = RowKernelRMSNorm(PlainRMSNorm(16), row_kernels())
    x = torch.randn(3, 16, dtype=torch.float64)
    assert norm(x).dtype == torch.float64
    assert torch.equal(norm(x), norm._original[0](x))


def test_the_rotary_wrapper_takes_the_kernel_only_inside_an_engine_step():
    calls = []

    def spy(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(cos.shape)
        if cos.shape[-1] != q.shape[-1]:
            return q, k  # a partial rotary's own code would go here
        return original_rotary()(q, k, cos, sin)

    wrapper = RowKernelRotary(spy, row_kernels())
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = torch.randn(2, 1, 5, 8).unbind(0)
    outside = wrapper(q, k, cos, sin)
    assert len(calls) == 1
    with engine_step():
        inside = wrapper(q, k, cos, sin)
        assert len(calls) == 1
        # a partial rotary (angles for half of each head) is not the kernel's: the original
        wrapper(q, k, cos[..., :4], sin[..., :4])
        assert len(calls) == 2
    assert all(close(a, b) for a, b in zip(inside, outside, strict=True))
    assert not cpu_row_ops._in_engine_step.get()


def test_the_engine_runs_its_model_on_the_row_kernels():
    from tokenfair.engine.hf.factory import make_hf_engine
    from tokenfair.engine.hf.loader import LoadedModel

    from .hf_models import tiny_model

    model = tiny_model.__wrapped__("llama")  # a fresh one: engines adopt theirs in place
    layers = len(model.model.layers)
    engine = make_hf_engine(LoadedModel("llama", model, None), kv_tokens=512)
    assert engine.executor.row_kernel_layers == 2 * layers + 1 + layers + 1
    # a second engine on the same model finds its layers swapped already
    again = make_hf_engine(LoadedModel("llama", model, None), kv_tokens=512)
    assert again.executor.row_kernel_layers == 1  # the rotary function, wrapped once
    assert not isinstance(model.model.norm._original[0], RowKernelRMSNorm)


def test_a_qwen3_model_with_head_norms_gives_transformers_tokens():
    """Qwen3 norms each head's queries and keys: row-kernel norms over views of the
    stacked projection, not over whole rows."""
    import copy

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tokenfair.engine.hf.factory import make_hf_engine
    from tokenfair.engine.hf.loader import LoadedModel

    from .hf_models import greedy_request, random_prompt

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()
    reference = copy.deepcopy(model)
    engine = make_hf_engine(LoadedModel("qwen3", model, None), kv_tokens=2048)
    # per layer: two norms, the query and key norms, the MLP; the final norm; rotary
    assert engine.executor.row_kernel_layers == 2 * 5 + 1 + 1
    prompts = [random_prompt(n, seed=n) for n in (5, 37, 90)]
    requests = [greedy_request(f"r{i}", p, 12) for i, p in enumerate(prompts)]
    for request in requests:
        engine.add_request(request)
    engine.run_until_done()
    for prompt, request in zip(prompts, requests, strict=True):
        with torch.inference_mode():
            out = reference.generate(
                torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                do_sample=False, eos_token_id=None, pad_token_id=0,
            )  # fmt: skip
        assert request.output_token_ids == out[0, len(prompt) :].tolist()
