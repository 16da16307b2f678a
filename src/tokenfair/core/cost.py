"""What a client is charged for its tokens (SPEC section 2): the one definition of service.

A cost function prices a request's prefill and the output tokens it has produced so far.
VTC's counters, the fairness metrics, VTC's bound and the figures all use it (through
`request_cost` for a whole request), so they always agree on what "service" means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class CostFunction(Protocol):
    def prefill(self, input_tokens: int) -> float:
        """Cost of prefilling a prompt of `input_tokens`."""
        ...

    def output(self, input_tokens: int, start: int, end: int) -> float:
        """Cost of output tokens start+1 .. end of a request with this prompt length."""
        ...


@dataclass(frozen=True, slots=True)
class LinearCost:
    """`w_in * n_in + w_out * n_out`: the paper's default service measure."""

    w_in: float = 1.0
    w_out: float = 2.0

    def __post_init__(self) -> None:
        if self.w_in < 0 or self.w_out < 0:
            raise ValueError("cost weights w_in and w_out must be >= 0")

    def prefill(self, input_tokens: int) -> float:
        return self.w_in * input_tokens

    def output(self, input_tokens: int, start: int, end: int) -> float:
        return self.w_out * (end - start)

    @property
    def unit(self) -> str:
        """How a figure's axis names this service, e.g. "in + 2×out tokens"."""
        return f"{self.w_in:g}×in + {self.w_out:g}×out tokens".replace("1×in", "in")


# The paper's service measure: every metric and figure uses it unless told otherwise.
DEFAULT_COST = LinearCost()


@dataclass(frozen=True, slots=True)
class ProfiledCost:
    """The paper's cost fitted on an A10G with Llama-7B: h(x, y), x input, y output so far.

    Prefill costs h(x, 0); the k-th output token costs h(x, k) - h(x, k - 1), so the
    charges for a whole request add up to h(x, n_out).
    """

    a_in: float = 0.21001891
    a_out: float = 0.10075395
    a_cross: float = 0.0039868
    a_out2: float = 0.00324733
    const: float = 1.14601454

    def h(self, x: int, y: int) -> float:
        return (
            self.a_in * x + self.a_out * y + self.a_cross * x * y + self.a_out2 * y * y + self.const
        )

    def prefill(self, input_tokens: int) -> float:
        return self.h(input_tokens, 0)

    def output(self, input_tokens: int, start: int, end: int) -> float:
        return self.h(input_tokens, end) - self.h(input_tokens, start)


def prompt_cost(
    cost: CostFunction, input_tokens: int, cached_tokens: int, cached_weight: float
) -> float:
    """The prefill charge of a prompt whose first `cached_tokens` came from the prefix
    cache, each of those weighing `cached_weight` of a computed token (1: the paper's
    cost, the prompt as sent; 0: only the tokens computed)."""
    full = cost.prefill(input_tokens)
    if not cached_tokens or cached_weight == 1.0:
        return full
    computed = cost.prefill(input_tokens - cached_tokens)
    return computed + cached_weight * (full - computed)


def request_cost(cost: CostFunction, input_tokens: int, output_tokens: int) -> float:
    """Total service of a request that produced `output_tokens`: what its client is charged."""
    return cost.prefill(input_tokens) + cost.output(input_tokens, 0, output_tokens)


def make_cost(name: str, w_in: float = 1.0, w_out: float = 2.0) -> CostFunction:
    """`linear` (with w_in, w_out) or `profiled`."""
    if name == "linear":
        return LinearCost(w_in, w_out)
    if name == "profiled":
        return ProfiledCost()
    raise ValueError(f"unknown cost function {name!r}: expected 'linear' or 'profiled'")
