"""Counting tokens without running the model.

Prompts are counted at dispatch, with the model's tokenizer when the config names one,
otherwise with an estimate: one token per 4 characters of text (rounded up), plus 4
tokens per chat message for the template's role markers and 2 for the reply's header.
A prompt given as token ids is counted exactly. Output is counted as chunks stream
back: the tokenizer's count of the chunk's text, or without a tokenizer one token per
chunk that carries text (how vLLM, SGLang and tokenfair stream) or chars/4 for a longer
chunk. Either way the usage the upstream reports at the end replaces the estimates.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from tokenfair.gateway.messages import text_of

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REPLY = 2


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


class TokenCounter:
    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer

    def text(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def chunk(self, text: str) -> int:
        """Tokens in one streamed chunk of output text."""
        if not text:
            return 0
        if self.tokenizer is not None:
            return max(1, self.text(text))
        return max(1, len(text) // CHARS_PER_TOKEN)

    def messages(self, messages: list[Any]) -> int:
        tokenizer = self.tokenizer
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            try:
                ids = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                    messages, tokenize=True, add_generation_prompt=True
                )
                return len(ids["input_ids"] if isinstance(ids, dict) else ids)
            except Exception:  # an odd message shape: fall back to counting text
                pass
        total = TOKENS_PER_REPLY
        for message in messages:
            if isinstance(message, dict):
                total += TOKENS_PER_MESSAGE + self.text(text_of(message.get("content")))
        return total

    def prompt(self, prompt: Any) -> int:
        """A completions prompt: text, token ids, or a batch of either."""
        if isinstance(prompt, str):
            return self.text(prompt)
        if isinstance(prompt, list):
            if all(isinstance(t, int) for t in prompt):
                return len(prompt)
            return sum(self.prompt(p) for p in prompt)
        return 0


def load_tokenizer(name: str) -> Tokenizer:
    """A transformers tokenizer from a local directory or the local hub cache."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
