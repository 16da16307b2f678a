"""A request and its lifecycle, as the scheduler sees it.

A request moves WAITING -> RUNNING -> FINISHED. Under memory pressure a RUNNING request
may be pushed back to PREEMPTED (its KV dropped; it waits again and re-prefills prompt +
generated tokens) or to SWAPPED (its KV parked in the CPU swap area; it resumes without
recomputation). Every request ends FINISHED with a reason.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # recompute: waits again, KV dropped
    SWAPPED = "swapped"  # KV in the CPU swap area
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS token or a stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # cancelled: client gone, timeout, operator
    REJECTED = "rejected"  # refused at arrival (rate limit, too long for the pool)


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token and when to stop (OpenAI-style fields)."""

    max_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs to return per token, or None
    # Penalties on tokens already seen (vLLM's and OpenAI's definitions): presence and
    # frequency over the output so far, repetition over prompt and output; 0, 0, 1: off.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if any(not stop for stop in self.stop):
            raise ValueError("stop strings must not be empty")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def penalized(self) -> bool:
        """Whether the logits are changed before sampling (greedy rows too)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )


@dataclass(slots=True, eq=False)
class Request:
    """One generation request.

    `prompt_token_ids` is None in the simulator, where only lengths matter. Trace
    replays (simulated or on a real model) set `target_output_tokens`, the length the
    model would generate before its EOS (the trace's output length): the scheduler
    ends the request there (STOP) in its model's stead, while `max_tokens` stays the
    request's limit (what reserve admission reserves).
    """

    request_id: str
    client: str
    input_tokens: int
    arrival_s: float
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_token_ids: list[int] | None = None
    priority: int = 0  # lower runs first (vLLM's convention)
    target_output_tokens: int | None = None  # trace replays: the natural output length
    predicted_output_tokens: int | None = None  # optional length hint for sjf/vtc-predict
    eos_token_ids: frozenset[int] = frozenset()
    # Prefix-cache isolation: blocks hash differently under different salts, so a
    # request can only reuse cached blocks computed under the same salt (servers pass
    # the tenant). None shares the cache with every unsalted request.
    cache_salt: str | None = None
    # Requests without token ids (the simulator's) say what they share by name: the
    # first `prefix_tokens` prompt tokens are the first tokens of the group's text
    # (trace files' `prefix_group`/`prefix_tokens`). A whole prompt on the group's
    # text (prefix_tokens == input_tokens, a chat turn) continues it with the output.
    prefix_group: str | None = None
    prefix_tokens: int = 0

    # --- lifecycle state, owned by the scheduler ---
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    output_token_ids: list[int] = field(default_factory=list)
    # len(output_token_ids), kept as a plain field rather than computed: the counter
    # policies read it once per generated token (CounterLedger.charge_output), and a
    # property call there cost 1-2% of the simulator's time. Whoever adds output tokens
    # keeps it current: append_output/extend_output, or Scheduler.update inline.
    num_output_tokens: int = field(default=0, init=False)
    # Its first output token, made by the prefill, is not charged (the scheduler's
    # `charge_first_token`, set when it arrives; the policies read it).
    first_token_free: bool = False
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    admit_seq: int = -1  # order of the latest admission (victim choice: newest first)
    ever_admitted: bool = False
    preemptions: int = 0
    scheduled_s: float | None = None  # first admitted
    first_token_s: float | None = None
    finish_s: float | None = None
    # Prompt tokens found in the prefix cache at the first admission (not prefilled).
    cached_tokens: int = 0
    # Chain hashes of the request's full KV blocks so far, computed once by the KV
    # cache manager (prefix lookups of a waiting request repeat every step).
    block_hashes: list[int] = field(default_factory=list)
    output_text: str = ""  # detokenized output (real models only)
    streamed_chars: int = 0  # how much of output_text has been handed out

    def __post_init__(self) -> None:
        if self.input_tokens < 1:
            raise ValueError(f"request {self.request_id}: input_tokens must be >= 1")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.input_tokens:
            raise ValueError(f"request {self.request_id}: input_tokens != len(prompt_token_ids)")
        if self.prefix_group is not None and not 0 < self.prefix_tokens <= self.input_tokens:
            raise ValueError(f"request {self.request_id}: prefix_tokens must be in [1, input]")
        self.num_output_tokens = len(self.output_token_ids)

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens

    def append_output(self, token: int) -> None:
        """Add one generated token, keeping `num_output_tokens` in step."""
        self.output_token_ids.append(token)
        self.num_output_tokens += 1

    def extend_output(self, tokens: Iterable[int]) -> None:
        """Add generated tokens, keeping `num_output_tokens` in step."""
        self.output_token_ids.extend(tokens)
        self.num_output_tokens = len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens: what a (re-)prefill must cover."""
        return self.input_tokens + self.num_output_tokens

    @property
    def max_total_tokens(self) -> int:
        """The most KV this request can ever need."""
        return self.input_tokens + self.sampling.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def shared_tokens(self) -> int:
        """Leading tokens on the prefix group's text (0 without a group)."""
        if self.prefix_group is None:
            return 0
        if self.prefix_tokens < self.input_tokens:
            return self.prefix_tokens
        return self.input_tokens + self.num_output_tokens

    def all_token_ids(self) -> list[int] | None:
        if self.prompt_token_ids is None:
            return None
        return self.prompt_token_ids + self.output_token_ids
