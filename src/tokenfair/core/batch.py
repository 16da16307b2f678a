"""What the scheduler hands the executor for one step, and what comes back.

The executor never decides anything: it runs the tokens it is given, writes their KV
into the blocks it is told, copies blocks for swaps, and samples one token for each
request whose scheduled tokens reach its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenfair.core.request import Request


@dataclass(slots=True)
class ScheduledRequest:
    """Run `num_new_tokens` tokens of `request`, starting at position `start`.

    `start` is the request's num_computed_tokens before this step. When
    `start + num_new_tokens == request.num_tokens` the step ends on the request's last
    known token, so the executor samples the next token (`samples` is True); a
    partial prefill chunk samples nothing.
    """

    request: Request
    num_new_tokens: int
    start: int
    block_ids: list[int]  # the request's whole block table (shared with the KV manager)

    @property
    def samples(self) -> bool:
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    # Block copies to run before the forward pass: (device block, swap block) for
    # swap-out, (swap block, device block) for swap-in.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    block_size: int = 16

    def step_shape(self) -> tuple[int, int, int]:
        """(prefill tokens, decode requests, context tokens the decodes attend to).

        The one definition of a step's shape: the simulator times steps by it and
        `tokenfair profile` fits real step times against it, so a profile means the
        same in both. A decode computes one token past the prompt.
        """
        prefill = decode = context = 0
        for s in self.scheduled:
            if s.num_new_tokens == 1 and s.start >= s.request.input_tokens:
                decode += 1
                context += s.start + 1
            else:
                prefill += s.num_new_tokens
        return prefill, decode, context

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.swap_out and not self.swap_in


@dataclass(slots=True)
class ExecutorOutput:
    """Sampled tokens by request id, for the scheduled requests that sample.

    `elapsed_s` is the step's duration: modelled by the simulator, measured by real
    executors (None lets the engine measure wall time itself).
    """

    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, list[dict[int, float]]] | None = None
    elapsed_s: float | None = None
