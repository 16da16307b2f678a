"""A tiny random Llama with a word-level tokenizer, saved as a local model directory.

Built with the transformers that vLLM's environment brings; loads in vLLM with no hub
access. Tokens are the words "t3" .. "t<vocab-1>" (ids 3..), so a prompt of n tokens
is " ".join(f"t{i}" ...) and its token ids are known without a tokenizer call.

    python tests/integrations/vllm/tiny_model.py OUT_DIR [--hidden 256 --layers 2 --vocab 512]
"""

from __future__ import annotations

import argparse
from pathlib import Path

BOS, EOS, UNK = 0, 1, 2
FIRST_WORD = 3


def build(
    out: str | Path,
    *,
    hidden: int = 256,
    layers: int = 2,
    vocab: int = 512,
    seed: int = 0,
    max_positions: int = 4096,
) -> Path:
    """Write the model and tokenizer to `out` (head size 64, the CPU kernels' size)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    words = {"<s>": BOS, "</s>": EOS, "<unk>": UNK}
    words.update({f"t{i}": i for i in range(FIRST_WORD, vocab)})
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(seed)
    heads = max(1, hidden // 64)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        bos_token_id=BOS,
        eos_token_id=EOS,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    fast.save_pretrained(out)
    return out


def prompt_ids(length: int, seed: int, vocab: int = 512) -> list[int]:
    """A reproducible prompt of `length` word ids (never a special token)."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(FIRST_WORD, vocab) for _ in range(length)]


def prompt_text(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--max-positions", type=int, default=4096)
    args = parser.parse_args()
    built = build(
        args.out,
        hidden=args.hidden,
        layers=args.layers,
        vocab=args.vocab,
        max_positions=args.max_positions,
    )
    print(built)


if __name__ == "__main__":
    main()
