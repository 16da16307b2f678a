"""The long-context-neighbor workload: one tenant floods long prompts beside light chat.

A `long` tenant sends long prompts (documents, code bases, transcripts) faster than the
GPU serves them, while `chat-0`, `chat-1`, ... send short chat turns far below their
share. VTC charges the long tenant for every token, yet what the chat tenants feel is
what the long tenant *holds*: the KV memory its prompts fill and the time of the steps
its prefill chunks take (docs/fairness.md, "What a tenant holds"). The figures to read
are the chat tenants' TTFT and TPOT against the same chat traffic alone
(`benchmarks/long_neighbor.py`).

Two shapes ship as suites:
- `long-neighbor` (the A10G case): 3,000-3,900-token prompts at 2 requests/s, about
  three times what the A10G Llama-2-7B profile serves, two chat tenants at 1 request/s;
- `long-neighbor-h200` (the long-context case): 32k-64k-token prompts at 0.5/s on an
  H200 with a large pool, where nothing queues for memory and the step is the
  contended resource, two chat tenants at 2 requests/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenfair.workloads.arrivals import Poisson
from tokenfair.workloads.client_workload import ClientWorkload
from tokenfair.workloads.lengths import ClientLengths, UniformInt

LONG_CLIENT = "long"
CHAT_PREFIX = "chat-"


@dataclass(frozen=True, slots=True)
class LongNeighborSpec:
    """The workload's knobs: the long tenant's prompts and rate, the chat tenants'."""

    long_prompt: tuple[int, int] = (3000, 3900)  # tokens, uniform, inclusive
    long_output: tuple[int, int] = (20, 100)
    long_rate: float = 2.0  # requests/s, Poisson
    chat_clients: int = 2
    chat_prompt: tuple[int, int] = (100, 400)
    chat_output: tuple[int, int] = (20, 200)
    chat_rate: float = 1.0  # requests/s of each chat tenant, Poisson
    duration_s: float = 300.0

    def __post_init__(self) -> None:
        if self.chat_clients < 1:
            raise ValueError(f"chat_clients must be >= 1, got {self.chat_clients}")
        for name in ("long_rate", "chat_rate", "duration_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")

    def chat_clients_names(self) -> list[str]:
        return [f"{CHAT_PREFIX}{i}" for i in range(self.chat_clients)]

    def client_specs(self, *, with_long: bool = True) -> tuple:
        """The clients, the long tenant first; without it, the chat traffic alone (the
        same requests: each client draws from its own stream)."""

        def lengths(prompt: tuple[int, int], output: tuple[int, int]) -> ClientLengths:
            return ClientLengths(UniformInt(*prompt), UniformInt(*output))

        long = ClientWorkload(
            LONG_CLIENT, Poisson(self.long_rate), lengths(self.long_prompt, self.long_output)
        )
        chats = tuple(
            ClientWorkload(
                name, Poisson(self.chat_rate), lengths(self.chat_prompt, self.chat_output)
            )
            for name in self.chat_clients_names()
        )
        # The long tenant keeps stream 0 whether or not it is there, so the chat
        # tenants' requests are the same in both runs.
        return ((long,) if with_long else (_Silent(LONG_CLIENT),)) + chats

    def describe(self) -> str:
        low, high = self.long_prompt
        return (
            f"'long' sends {low:,}-{high:,}-token prompts at {self.long_rate:g} req/s beside "
            f"{self.chat_clients} chat tenants at {self.chat_rate:g} req/s of "
            f"{self.chat_prompt[0]}-{self.chat_prompt[1]}-token prompts"
        )


A10G_CASE = LongNeighborSpec()
H200_CASE = LongNeighborSpec(
    long_prompt=(32_768, 65_536),
    long_output=(100, 300),
    long_rate=0.5,
    chat_rate=2.0,
    duration_s=120.0,
)


@dataclass(frozen=True, slots=True)
class _Silent:
    """A client that sends nothing: holds its place (and random stream) in the list."""

    client: str
    weight: float = 1.0

    def draw(self, rng: object, duration_s: float) -> list:
        return []
