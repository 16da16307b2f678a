"""What a policy sees of a request: the narrow view every driver provides.

A policy reads these fields and nothing else of a request. The simulator and the
real-model engine hand it their own `Request` (core/request.py), which has them all;
a driver that keeps its requests elsewhere (the vLLM plugin's are vLLM's, the
gateway's are tickets) hands it a `PolicyRequest`, which holds just these and which
the driver keeps current. Counts are what the driver reports: a policy charges output
from `num_output_tokens`, never from token ids it would have to be given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tokenfair.core.request import FinishReason


class RequestView(Protocol):
    """The fields a policy may read (all read-only to the policy)."""

    @property
    def request_id(self) -> str:
        """Unique among the requests the driver has not finished."""
        ...

    @property
    def client(self) -> str:
        """The tenant (the share tree's leaf) whose service this is."""
        ...

    @property
    def priority(self) -> int:
        """Lower runs first (vLLM's convention); 0 unless the client said otherwise."""
        ...

    @property
    def arrival_s(self) -> float:
        """When it arrived, on the driver's clock (the `now` the policy is given)."""
        ...

    @property
    def input_tokens(self) -> int:
        """Prompt tokens."""
        ...

    @property
    def max_tokens(self) -> int:
        """The most output tokens it may generate."""
        ...

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache at its first admission (set before
        `on_admit` is called for it the first time)."""
        ...

    @property
    def num_output_tokens(self) -> int:
        """Output tokens generated so far, as the driver last reported them."""
        ...

    @property
    def first_token_free(self) -> bool:
        """Its first output token is not charged: the driver made it with the prompt's
        prefill (the paper's router). Set by the driver when the request arrives."""
        ...

    @property
    def predicted_output_tokens(self) -> int | None:
        """The client's own hint of its output length, where it gave one."""
        ...

    @property
    def target_output_tokens(self) -> int | None:
        """The true output length, known only to trace replays (oracle experiments)."""
        ...

    @property
    def admit_seq(self) -> int:
        """The order of its latest admission (-1 before the first): victim choice."""
        ...

    @property
    def finish_reason(self) -> FinishReason | None:
        """Why it ended, once it has (seen by `on_finish`)."""
        ...


@dataclass(slots=True, eq=False)
class PolicyRequest:
    """A `RequestView` for drivers that keep no core `Request`; the driver updates
    `num_output_tokens` and `finish_reason`, and its starts (`Starts`) `cached_tokens`,
    `admit_seq` and `ever_admitted`."""

    request_id: str
    client: str
    input_tokens: int
    arrival_s: float = 0.0
    max_tokens: int = 256
    priority: int = 0
    predicted_output_tokens: int | None = None
    target_output_tokens: int | None = None
    cached_tokens: int = 0
    num_output_tokens: int = 0
    first_token_free: bool = False
    admit_seq: int = -1
    ever_admitted: bool = False  # its prompt is paid (core/policies/starts.py)
    finish_reason: FinishReason | None = None
