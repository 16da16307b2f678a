"""QKV and gate-up stacked into one matrix each: the model computes what it computed
before, its projections called in turn or out of turn, and the engine stacks them by
default (its greedy tokens are checked against transformers' in test_hf_greedy)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tokenfair.engine.hf.factory import make_hf_engine  # noqa: E402
from tokenfair.engine.hf.fused_projections import (  # noqa: E402
    ProjectionPart,
    fuse_projections,
)
from tokenfair.engine.hf.loader import LoadedModel  # noqa: E402

from .hf_models import FAMILIES, dense_model, random_prompt, tiny_model  # noqa: E402

pytestmark = pytest.mark.model


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stacked_model_computes_what_it_did(family):
    model = tiny_model.__wrapped__(family)
    ids = torch.tensor([random_prompt(23, seed=5)])
    with torch.inference_mode():
        before = model(ids).logits
        groups = fuse_projections(model)
        after = model(ids).logits
    # Llama and Qwen2: QKV and gate-up in each of 2 layers; GPT-2 stacks its own already.
    assert groups == (0 if family == "gpt2" else 4)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_a_member_called_out_of_turn_computes_its_own_columns():
    model = tiny_model.__wrapped__("llama")
    attention = model.model.layers[0].self_attn
    dense = dense_model("llama").model.layers[0].self_attn
    fuse_projections(model)
    assert isinstance(attention.k_proj, ProjectionPart)
    x, y = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    with torch.inference_mode():
        torch.testing.assert_close(attention.k_proj(y), dense.k_proj(y))  # before q_proj
        torch.testing.assert_close(attention.q_proj(x), dense.q_proj(x))
        torch.testing.assert_close(attention.k_proj(y), dense.k_proj(y))  # another input
        torch.testing.assert_close(attention.v_proj(x), dense.v_proj(x))


@pytest.mark.parametrize("fuse", [True, False])
def test_the_engine_stacks_projections_unless_told_not_to(fuse):
    loaded = LoadedModel("llama", tiny_model.__wrapped__("llama"), None)  # a fresh copy
    engine = make_hf_engine(loaded, kv_tokens=512, fuse_projections=fuse)
    assert engine.executor.fused_projection_groups == (4 if fuse else 0)
