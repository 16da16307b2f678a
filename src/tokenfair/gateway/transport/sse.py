"""Reading an upstream's SSE stream on the way through: count tokens, find usage.

Events pass on as soon as they are complete (an incomplete event is useless to a
client); only the usage-only chunk the gateway itself asked for is held back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

UsageHook = Callable[[int, int, int], None]  # prompt, completion, cached prompt tokens


def choice_text(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    text = choice.get("text")
    if isinstance(text, str):
        return text
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    parts = [delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning")]
    out = "".join(p for p in parts if isinstance(p, str))
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                out += function["arguments"]
    return out


def usage_of(data: Any) -> tuple[int, int, int] | None:
    """(prompt, completion, cached prompt tokens) of a response's usage, or None.

    The cached count is OpenAI's `prompt_tokens_details.cached_tokens` (vLLM reports it
    with --enable-prompt-tokens-details, tokenfair's server always); 0 when absent.
    """
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not (isinstance(prompt, int) and isinstance(completion, int)):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int) or isinstance(cached, bool):
        cached = 0
    return prompt, completion, max(0, min(cached, prompt))


def finish_reason_of(data: Any) -> Any:
    """The first choice's finish reason of a non-streaming answer, or None."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0].get("finish_reason")
    return None


def error_code_of(data: Any) -> Any:
    """The `code` of an OpenAI-shaped error answer, or None."""
    error = data.get("error") if isinstance(data, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def text_of_answer(data: Any) -> str:
    """The generated text of a non-streaming answer: every choice's `text` (completions)
    or `message.content` (chat)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    parts: list[str] = []
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if isinstance(text, str):
            parts.append(text)
    return "".join(parts)


class SSEReader:
    """Splits bytes into events; `feed` returns the bytes to forward now."""

    def __init__(
        self,
        count_text: Callable[[str], int],
        on_tokens: Callable[[int], None],
        on_usage: UsageHook,
        hide_usage_chunk: bool,
    ) -> None:
        self.count_text = count_text
        self.on_tokens = on_tokens
        self.on_usage = on_usage
        self.hide_usage_chunk = hide_usage_chunk
        self._buffer = b""
        self.saw_done = False
        self.error: Any = None
        # Choice 0's, as a non-streaming answer's is read (finish_reason_of) and as the
        # server counts a request of several choices.
        self.finish_reason: Any = None
        # The last chunk's id, object, created and model: a usage chunk the gateway
        # writes itself (the upstream broke off) carries them as the upstream's would.
        self.meta: dict[str, Any] = {}

    def feed(self, chunk: bytes) -> bytes:
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\r\n" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        end = buffer.rfind(b"\n\n")
        if end < 0:
            self._buffer = buffer
            return b""
        self._buffer = buffer[end + 2 :]
        out: list[bytes] = []
        for event in buffer[: end + 2].split(b"\n\n"):
            if event and self._keep(event):
                out.append(event + b"\n\n")
        return b"".join(out)

    def usage_event(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        """A usage-only chunk, as OpenAI's last one, for a stream the gateway ends."""
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        return b"data: " + orjson.dumps({**self.meta, "choices": [], "usage": usage}) + b"\n\n"

    def tail(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rest

    def _keep(self, event: bytes) -> bool:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.saw_done = True
                continue
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(data, dict):
                continue
            if "error" in data:
                self.error = data["error"]
            choices = data.get("choices")
            if choices and not self.meta:
                self.meta = {k: data[k] for k in ("id", "object", "created", "model") if k in data}
            tokens = 0
            if isinstance(choices, list):
                for choice in choices:
                    text = choice_text(choice)
                    if text:
                        tokens += self.count_text(text)
                    reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                    if reason is not None and choice.get("index", 0) == 0:
                        self.finish_reason = reason
            if tokens:
                self.on_tokens(tokens)
            usage = usage_of(data)
            if usage is not None:
                self.on_usage(*usage)
                if self.hide_usage_chunk and not choices:
                    return False
        return True
