"""`builtin:tiny`: a model that needs nothing downloaded, to exercise the serving path.

A small Llama-architecture network with weights drawn from a fixed seed, and a
byte-level tokenizer (the 256 byte values plus a few special tokens, with a simple chat
template). It is built in-process in well under a second and runs hundreds of tokens/s
across a batch on two CPU cores.

ITS TEXT IS MEANINGLESS. The weights are random: it produces arbitrary bytes. It exists so
that the scheduler, the engine, the server and the benchmarks can run real forward
passes, real KV caches and real sampling anywhere. Use `--model PATH` with a local
transformers model directory for real text.
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tokenfair.engine.hf.tokenizer import ChatMessage

BUILTIN_PREFIX = "builtin:"
# The builtins' KV pool when none is asked for: room for 64 sequences of 1,024 tokens,
# enough for every test and demo, built in a fraction of a second. Sized from free
# memory instead, as a real model's is, it would reserve gigabytes it never fills and
# take tens of seconds to page in before the server is healthy.
BUILTIN_KV_TOKENS = 65_536
SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
BOS, EOS = 256, 257


class ByteTokenizer:
    """UTF-8 bytes are tokens 0-255; special tokens follow from 256."""

    vocab_size = 256 + len(SPECIAL_TOKENS)
    eos_token_ids = frozenset({EOS})
    _special_ids: ClassVar[dict[str, int]] = {
        name: 256 + i for i, name in enumerate(SPECIAL_TOKENS)
    }
    _special_pattern = re.compile("|".join(re.escape(s) for s in SPECIAL_TOKENS))

    def encode(self, text: str) -> list[int]:
        """Bytes of the text; special-token strings in it become their ids."""
        ids: list[int] = []
        at = 0
        for match in self._special_pattern.finditer(text):
            ids.extend(text[at : match.start()].encode())
            ids.append(self._special_ids[match.group()])
            at = match.end()
        ids.extend(text[at:].encode())
        return ids

    def decode(self, token_ids: list[int]) -> str:
        """Special tokens are dropped; invalid UTF-8 shows as U+FFFD."""
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: list[ChatMessage]) -> list[int]:
        """<|bos|> then <|role|>content<|end|> per message, then <|assistant|>."""
        text = "<|bos|>"
        for message in messages:
            role = message["role"]
            if f"<|{role}|>" not in SPECIAL_TOKENS:
                raise ValueError(f"unknown chat role {role!r}; use system, user or assistant")
            text += f"<|{role}|>{message['content']}<|end|>"
        return self.encode(text + "<|assistant|>")


TINY_SEED = 1234
OUTPUT_SCALE = 30.0
EOS_SCALE = 0.6  # a weaker EOS row: replies run for a while before ending


def tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=None,
    )


def build_tiny(
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaForCausalLM:
    """The builtin tiny model; the same weights every time, on every machine."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(tiny_config())
    with torch.no_grad():
        # Only printable ASCII, newline and EOS get output weights, so the meaningless
        # text at least prints cleanly; every other token's logit stays 0, below the
        # winners. The scale makes logits peaked (std ~ several units), so greedy
        # decoding does not flip on rounding differences between batch shapes.
        keep = torch.zeros(ByteTokenizer.vocab_size, dtype=torch.bool)
        keep[32:127] = True
        keep[ord("\n")] = True
        keep[EOS] = True
        head = model.lm_head.weight
        head.mul_(keep[:, None] * OUTPUT_SCALE)
        head[EOS].mul_(EOS_SCALE)
    model = model.to(device=device, dtype=dtype)
    return model.eval()


BUILTIN_MODELS = {"tiny": build_tiny}
