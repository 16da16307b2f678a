"""Request fields the server knows and cannot honour: refused with a 400 naming the field
and saying why, rather than accepted and silently ignored (a JSON-mode client would get
free text, a tool-calling one no tool call). Each is accepted at its "off" value.

OpenAI's fields first, then vLLM's extensions that change what is generated. A field
the server does not know at all is ignored, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# field -> (whether a value asks nothing of the server, why it cannot be honoured)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "response_format": (
        lambda v: v is None or v == {"type": "text"},
        "structured output (json_object, json_schema) needs guided decoding, which this "
        'server does not do; send {"type": "text"} or leave it out',
    ),
    "tools": (
        lambda v: v is None or v == [],
        "this server does not call tools: it has no tool parser",
    ),
    "tool_choice": (
        lambda v: v is None or v in ("none", "auto"),
        'this server does not call tools: only "none" or "auto" (no tool) is accepted',
    ),
    "functions": (lambda v: v is None or v == [], "this server does not call functions"),
    "function_call": (
        lambda v: v is None or v in ("none", "auto"),
        "this server does not call functions",
    ),
    "echo": (
        lambda v: v is None or v is False,
        "the answer never repeats the prompt (nor gives its logprobs); leave echo out",
    ),
    "suffix": (lambda v: v is None, "inserting text (a suffix) is not supported"),
    "audio": (lambda v: v is None, "audio output is not supported"),
    "modalities": (lambda v: v is None or v == ["text"], 'only ["text"] output is supported'),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "reasoning_effort": (lambda v: v is None, "the served model has no reasoning effort"),
    "web_search_options": (lambda v: v is None, "web search is not supported"),
    # vLLM's extensions
    "guided_json": (lambda v: v is None, "guided decoding is not supported"),
    "guided_regex": (lambda v: v is None, "guided decoding is not supported"),
    "guided_choice": (lambda v: v is None, "guided decoding is not supported"),
    "guided_grammar": (lambda v: v is None, "guided decoding is not supported"),
    "structured_outputs": (lambda v: v is None, "guided decoding is not supported"),
    "use_beam_search": (lambda v: v is None or v is False, "beam search is not supported"),
    "min_tokens": (lambda v: v is None or v == 0, "min_tokens is not supported"),
    "include_stop_str_in_output": (
        lambda v: v is None or v is False,
        "a stop string is never included in the output",
    ),
    "prompt_logprobs": (lambda v: v is None, "prompt logprobs are not returned"),
    "allowed_token_ids": (lambda v: v is None, "allowed_token_ids is not supported"),
    "bad_words": (lambda v: v is None or v == [], "bad_words is not supported"),
    "truncate_prompt_tokens": (
        lambda v: v is None,
        "prompts are never truncated: a prompt too long is refused",
    ),
    "chat_template": (lambda v: v is None, "the model's own chat template is always used"),
    "chat_template_kwargs": (lambda v: v is None, "the chat template takes no arguments here"),
    "continue_final_message": (
        lambda v: v is None or v is False,
        "continuing the final message is not supported",
    ),
}


def refusal(field: str, value: Any) -> str | None:
    """Why `value` of `field` cannot be honoured, or None when it asks nothing."""
    accepted, why = REFUSED[field]
    return None if accepted(value) else f"not supported: {why}"
