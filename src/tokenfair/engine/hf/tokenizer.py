"""Text <-> tokens for the engine: one small interface over our byte tokenizer and
transformers' tokenizers, plus the incremental detokenizer the engine uses for streaming
text and stop strings.
"""

from __future__ import annotations

from typing import Protocol

ChatMessage = dict[str, str]  # {"role": "user" | "system" | "assistant", "content": ...}


class TextTokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def chat_prompt(self, messages: list[ChatMessage]) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for the reply."""
        ...


class HFTokenizer:
    """A transformers tokenizer behind `TextTokenizer`."""

    def __init__(self, tokenizer, extra_eos: int | list[int] | None = None) -> None:
        self.inner = tokenizer
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        if extra_eos is not None:  # generation_config's eos may list several ids
            eos |= set(extra_eos) if isinstance(extra_eos, list) else {extra_eos}
        self.eos_token_ids = frozenset(eos)
        # The incremental detokenizer decodes twice per token of every request; most of
        # transformers' `decode` is wrapping around the `tokenizers` library's own.
        self._backend_decode = _backend_decode(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(token_ids, skip_special_tokens=True)
        return self.inner.decode(token_ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[ChatMessage]) -> list[int]:
        if getattr(self.inner, "chat_template", None) is None:
            # Models without a template: plain "role: content" lines.
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
            return self.encode(text)
        ids = self.inner.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in some versions
            ids = ids["input_ids"]
        return list(ids)


def _backend_decode(tokenizer):
    """The `tokenizers` library's own decode where transformers' `decode` comes to
    exactly that call (a fast tokenizer whose decoding no subclass changes and that
    cleans up no spaces), else None: the text is the same either way."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    kind = type(tokenizer)
    if not (
        isinstance(tokenizer, TokenizersBackend)
        and kind.decode is PreTrainedTokenizerBase.decode
        and kind._decode is TokenizersBackend._decode
        and not tokenizer.clean_up_tokenization_spaces
    ):
        return None
    backend = getattr(tokenizer, "_tokenizer", None)
    return getattr(backend, "decode", None)


class IncrementalDetokenizer:
    """The engine's `Detokenizer`: text added by each new token of each request.

    Decoding a growing tail twice (before and after the new tokens) and diffing keeps
    the cost per token constant and gets multi-token characters right: while the tail
    ends in an incomplete UTF-8 sequence (U+FFFD) nothing is emitted yet.
    """

    _CONTEXT = 6  # tokens decoded before the unread ones, so merges at the seam are seen

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self._offsets: dict[str, tuple[int, int]] = {}  # id -> (prefix start, read upto)

    def new_text(self, request_id: str, output_token_ids: list[int]) -> str:
        prefix, read = self._offsets.get(request_id, (0, 0))
        decode = self.tokenizer.decode
        before = decode(output_token_ids[prefix:read])
        after = decode(output_token_ids[prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._offsets[request_id] = (
            max(0, len(output_token_ids) - self._CONTEXT),
            len(output_token_ids),
        )
        return after[len(before) :]

    def forget(self, request_id: str) -> None:
        self._offsets.pop(request_id, None)
