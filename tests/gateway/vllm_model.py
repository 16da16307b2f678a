"""Writes a tiny random Llama and a word-level tokenizer for the real-vLLM upstream test.

Run with vLLM's own Python (its transformers): `python vllm_model.py OUT_DIR`. Token
`t<i>` has id i, so prompts of known length are easy to write.
"""

from __future__ import annotations

import sys


def main(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, 512)}}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
