"""Tiny random transformers models, a reference greedy decoder and engine helpers
for the HF engine tests."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tokenfair.core.request import Request, SamplingParams  # noqa: E402
from tokenfair.engine.hf.factory import make_hf_engine  # noqa: E402
from tokenfair.engine.hf.loader import LoadedModel  # noqa: E402
from tokenfair.engine.hf.tokenizer import TextTokenizer  # noqa: E402

VOCAB = 512
FAMILIES = ("llama", "qwen2", "gpt2")


@functools.cache
def tiny_model(family: str):
    """A 2-layer random model of `family`; cached, as building and warming take time."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2, **shape))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, num_key_value_heads=2, **shape))
    elif family == "gpt2":
        config = GPT2Config(
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=1024,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(family)
    return model.eval()


class IdTokenizer:
    """Token ids as text (space separated): enough for engine plumbing in tests."""

    eos_token_ids: frozenset[int] = frozenset()

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(f" {t}" for t in token_ids)

    def chat_prompt(self, messages):
        raise NotImplementedError


def loaded(family: str, tokenizer: TextTokenizer | None = None) -> LoadedModel:
    return LoadedModel(family, tiny_model(family), tokenizer or IdTokenizer())


def random_prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (length,), generator=g).tolist()


@functools.cache
def dense_model(family: str):
    """The same weights as `tiny_model(family)` in a copy no engine adopts: engines pack
    the linear layers of the models they serve (cpu_linear), the reference must not."""
    return tiny_model.__wrapped__(family)


@functools.cache
def _reference(family: str, prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    model = dense_model(family)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return tuple(out[0, len(prompt) :].tolist())


def reference(family: str, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' own greedy continuation (no EOS stop): what the engine must match."""
    return list(_reference(family, tuple(prompt), max_tokens))


def greedy_request(rid: str, prompt: list[int], max_tokens: int, client: str = "c") -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, client, len(prompt), 0.0, sampling, prompt_token_ids=prompt)


def engine_for(family: str, **options):
    options.setdefault("kv_tokens", 4096)
    options.setdefault("max_batched_tokens", 512)
    return make_hf_engine(loaded(family), **options)


def assert_pool_free(engine) -> None:
    kv = engine.scheduler.kv
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks, "KV blocks still held after every request ended"
    assert kv.num_free_swap_blocks == kv.num_swap_blocks, "swap blocks still held"
    assert not kv.holders()
