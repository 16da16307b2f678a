"""The engine decodes through the `tokenizers` library directly where transformers'
`decode` comes to that call, and gets transformers' text exactly; elsewhere (spaces
cleaned up, a subclass decoding its own way) it keeps transformers' `decode`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tokenfair.engine.hf.tokenizer import HFTokenizer

pytestmark = pytest.mark.model


def byte_level_bpe() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    core = Tokenizer(models.BPE(vocab, merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", bos_token="<s>")
    fast.add_special_tokens({"additional_special_tokens": ["<x>"]})
    return fast


def word_level(clean_up: bool) -> PreTrainedTokenizerFast:
    vocab = {f"w{i}": i for i in range(40)} | {"<unk>": 40, ".": 41, ",": 42}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", clean_up_tokenization_spaces=clean_up
    )


BPE = HFTokenizer(byte_level_bpe())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(BPE.inner) - 1), max_size=20))
def test_the_direct_decode_is_transformers_decode(ids):
    assert BPE._backend_decode is not None
    assert BPE.decode(ids) == BPE.inner.decode(ids, skip_special_tokens=True)


def test_tokenizers_that_clean_up_spaces_keep_transformers_decode():
    cleaned = HFTokenizer(word_level(clean_up=True))
    assert cleaned._backend_decode is None
    ids = cleaned.inner.encode("w1 , w2 .")
    assert cleaned.decode(ids) == cleaned.inner.decode(ids, skip_special_tokens=True)
    assert HFTokenizer(word_level(clean_up=False))._backend_decode is not None


def test_a_subclass_decoding_its_own_way_keeps_its_decode():
    class Shouting(PreTrainedTokenizerFast):
        def _decode(self, token_ids, **kwargs):
            return super()._decode(token_ids, **kwargs).upper()

    core = byte_level_bpe().backend_tokenizer
    shouting = HFTokenizer(Shouting(tokenizer_object=core))
    assert shouting._backend_decode is None
    assert shouting.decode(shouting.inner.encode("the")) == "THE"
