"""The request bodies the server accepts, as pydantic models (OpenAI's field names).

Unknown fields are ignored, as the OpenAI API does; fields the server cannot honour
(n > 1, echo, best_of > 1, non-text message parts) are refused by the schema itself, so
`/openapi.json` describes exactly what is accepted. Types are strict, as OpenAI's are:
`"max_tokens": "2"` or `"stream": 1` is a 400, not a guess (an integer is a number,
though). An explicit `null` means the default for every field OpenAI marks nullable.
`priority` (lower runs first), `top_k` and `ignore_eos` follow vLLM's extensions.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MAX_INT = 2**31 - 1
MAX_STOPS = 16
MAX_LOGPROBS = 20

StopString = Annotated[str, Field(min_length=1, max_length=512)]
TokenId = Annotated[int, Field(ge=0, le=MAX_INT)]


# Every request model: unknown fields ignored, strict types.
STRICT = ConfigDict(extra="ignore", strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool | None = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints."""

    model_config = STRICT

    model: str = Field(min_length=1, max_length=512)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0, le=MAX_INT, description="vLLM extension; 0 = off")
    stop: StopString | list[StopString] | None = Field(default=None)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    n: Literal[1] | None = Field(default=1, description="Only one choice per request is supported.")
    user: str | None = Field(default=None, max_length=256)
    priority: int | None = Field(
        default=None, ge=-MAX_INT, le=MAX_INT, description="Lower runs first (vLLM's convention)."
    )
    ignore_eos: bool | None = Field(
        default=False, description="vLLM extension: generate max_tokens tokens."
    )

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] = Field(
        description="One prompt: a string or a list of token ids (a one-element list of either is accepted)."
    )
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: Literal[False] | None = False
    best_of: Literal[1] | None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(
        cls, value: str | list[int] | list[str] | list[list[int]]
    ) -> str | list[int] | list[str] | list[list[int]]:
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if isinstance(value[0], (str, list)) and len(value) != 1:
                raise ValueError("only one prompt per request is supported")
        return value

    def prompt_value(self) -> str | list[int]:
        """The single prompt, unwrapped from a one-element list."""
        value = self.prompt
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            return value[0]
        return value  # type: ignore[return-value]


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=256)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: a conversation rendered by the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true, as OpenAI's API does")
        return value

    def token_limit(self) -> int | None:
        """max_completion_tokens, or the older max_tokens."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0
