"""The request bodies the server accepts, as pydantic models (OpenAI's field names).

Every field of OpenAI's completions and chat APIs is honoured or refused with a 400
naming it (refused_fields.py: structured output, tools, echo...); so are vLLM's
extensions that change what is generated. A field the server does not know is
ignored, as vLLM does. Types are strict, as OpenAI's are: `"max_tokens": "2"` or
`"stream": 1` is a 400, not a guess (an integer is a number, though). An explicit
`null` means the default for every field OpenAI marks nullable. `priority` (lower runs
first), `top_k` (-1 or 0: off), `min_p`, `repetition_penalty`, `stop_token_ids` and
`ignore_eos` follow vLLM's extensions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tokenfair.server.refused_fields import refusal

MAX_INT = 2**31 - 1
MAX_STOPS = 16
MAX_LOGPROBS = 20
MAX_CHOICES = 128  # n x prompts: the engine requests one HTTP request may make
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows

StopString = Annotated[str, Field(min_length=1, max_length=512)]
TokenId = Annotated[int, Field(ge=0, le=MAX_INT)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]


def _refused(description: str) -> Any:
    return Field(default=None, description=f"Refused unless off: {description}")


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
    top_k: int | None = Field(
        default=None, ge=-1, le=MAX_INT, description="vLLM extension; -1 or 0 = off"
    )
    stop: StopString | list[StopString] | None = Field(default=None)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    n: int | None = Field(
        default=1, ge=1, le=MAX_CHOICES, description="Choices per prompt (each its own sample)."
    )
    presence_penalty: Penalty | None = Field(default=None, description="0: off.")
    frequency_penalty: Penalty | None = Field(default=None, description="0: off.")
    repetition_penalty: float | None = Field(
        default=None, gt=0, le=10, allow_inf_nan=False, description="vLLM extension; 1: off."
    )
    min_p: float | None = Field(
        default=None, ge=0, le=1, allow_inf_nan=False, description="vLLM extension; 0: off."
    )
    logit_bias: dict[str, Bias] | None = Field(
        default=None, description="Token id (as a string) -> bias added to its logit."
    )
    stop_token_ids: list[TokenId] | None = Field(
        default=None, max_length=64, description="vLLM extension: token ids that end the output."
    )
    user: str | None = Field(default=None, max_length=256)
    priority: int | None = Field(
        default=None, ge=-MAX_INT, le=MAX_INT, description="Lower runs first (vLLM's convention)."
    )
    ignore_eos: bool | None = Field(
        default=False, description="vLLM extension: generate max_tokens tokens."
    )
    cache_salt: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="vLLM extension: the prompt's cached blocks are shared only with requests "
        "of the same salt (within the tenant's own).",
    )
    # Known, and refused unless off (refused_fields.py): the message says why.
    response_format: Any = _refused("{'type': 'text'}")
    guided_json: Any = _refused("null")
    guided_regex: Any = _refused("null")
    guided_choice: Any = _refused("null")
    guided_grammar: Any = _refused("null")
    structured_outputs: Any = _refused("null")
    use_beam_search: Any = _refused("false")
    min_tokens: Any = _refused("0")
    include_stop_str_in_output: Any = _refused("false")
    prompt_logprobs: Any = _refused("null")
    allowed_token_ids: Any = _refused("null")
    bad_words: Any = _refused("[]")
    truncate_prompt_tokens: Any = _refused("null")

    @field_validator(
        "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "structured_outputs", "use_beam_search", "min_tokens", "include_stop_str_in_output",
        "prompt_logprobs", "allowed_token_ids", "bad_words", "truncate_prompt_tokens",
        "echo", "suffix", "tools", "tool_choice", "functions", "function_call", "audio",
        "modalities", "prediction", "reasoning_effort", "web_search_options",
        "chat_template", "chat_template_kwargs", "continue_final_message",
        mode="before", check_fields=False,
    )  # fmt: skip
    @classmethod
    def _honoured_or_refused(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        why = refusal(info.field_name, value)
        if why is not None:
            raise ValueError(why)
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            if len(value) > MAX_LOGIT_BIAS:
                raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
            for key in value:
                if not key.isdigit() or int(key) > MAX_INT:
                    raise ValueError(f"{key!r} is not a token id (a number, as a string)")
        return value

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

    @property
    def choices(self) -> int:
        return self.n or 1


class CompletionRequest(SamplingFields):
    """POST /v1/completions: a prompt, or a list of prompts, as text or token ids."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] = Field(
        description="A prompt (text or token ids), or a list of them: each gets n choices."
    )
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1, description="Only n (or 1): no beam search.")
    echo: Any = _refused("false")
    suffix: Any = _refused("null")

    @field_validator("prompt")
    @classmethod
    def _prompts(
        cls, value: str | list[int] | list[str] | list[list[int]]
    ) -> str | list[int] | list[str] | list[list[int]]:
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if isinstance(value[0], (str, list)) and len(value) > MAX_CHOICES:
                raise ValueError(f"at most {MAX_CHOICES} prompts per request")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n") or 1
        if value not in (None, 1, n):
            raise ValueError(
                f"best_of ({value}) must equal n ({n}): no choice is sampled to be dropped"
            )
        return value

    def prompt_values(self) -> list[str | list[int]]:
        """Every prompt: one string or one list of token ids each."""
        value = self.prompt
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            return list(value)
        return [value]  # type: ignore[list-item]


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
    # Accepted, asking nothing of generation: OpenAI's bookkeeping and routing hints.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None  # without tools, nothing to parallelise
    # Known, and refused unless off (refused_fields.py).
    tools: Any = _refused("[]")
    tool_choice: Any = _refused("'none' or 'auto'")
    functions: Any = _refused("[]")
    function_call: Any = _refused("'none' or 'auto'")
    audio: Any = _refused("null")
    modalities: Any = _refused("['text']")
    prediction: Any = _refused("null")
    reasoning_effort: Any = _refused("null")
    web_search_options: Any = _refused("null")
    chat_template: Any = _refused("null")
    chat_template_kwargs: Any = _refused("null")
    continue_final_message: Any = _refused("false")

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
