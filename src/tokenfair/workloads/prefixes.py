"""Clients whose prompts share prefixes: a system prompt each, conversations, or documents.

Production traffic repeats leading tokens: a product's system prompt (or few-shot
template, or RAG document) before every question, and a chat's whole history before
every new turn. These client kinds draw such requests with their trace prefix fields
(`prefix_group`, `prefix_tokens`: see workloads/trace.py), so the simulator's prefix
cache can reuse them.

Groups are named after the client (`client-0/system`, `client-0/conv-3`,
`client-0/doc-1`): prefixes are never shared across clients, as a server that salts its
cache per tenant never shares them. The one exception is asked for by name: documents
that every client of a `documents` workload reads (`shared/doc-0`, ...), as on a server
whose tenants share a cache.

Conversations are open-loop: turn k+1 arrives a drawn gap after turn k arrived,
whether or not turn k was answered by then (a trace cannot wait for a server); the gap
includes the answer's generation and the user's reading and typing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tokenfair.workloads.arrivals import ArrivalProcess
from tokenfair.workloads.lengths import ClientLengths, LengthDist


@dataclass(frozen=True, slots=True)
class RequestDraw:
    """One drawn request of a client, before requests are merged and numbered."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    prefix_group: str | None = None
    prefix_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class SystemPromptClient:
    """Every request is the client's own system prompt followed by a question.

    The system prompt's length is drawn once per client from `system_prompt`; each
    request's question and answer from `question`.
    """

    client: str
    arrivals: ArrivalProcess
    system_prompt: LengthDist
    question: ClientLengths
    weight: float = 1.0

    def draw(self, rng: np.random.Generator, duration_s: float) -> list[RequestDraw]:
        times = self.arrivals.times(rng, 0.0, duration_s)
        prompt = int(self.system_prompt.sample(rng, 1)[0])
        questions, answers = self.question.sample(rng, len(times))
        group = f"{self.client}/system"
        return [
            RequestDraw(float(t), prompt + int(q), int(a), group, prompt)
            for t, q, a in zip(times, questions, answers, strict=True)
        ]


@dataclass(frozen=True, slots=True)
class ConversationClient:
    """The client opens conversations; each turn's prompt is the whole conversation so
    far (every earlier message and answer) plus a new message.

    `starts`: when conversations open; `turns`: how many turns one has; `gap_s`: the
    mean time between a turn's arrival and the next (exponential); `message` and
    `answer`: each turn's new tokens. A conversation ends early rather than grow past
    `max_context` tokens (prompt + answer).
    """

    client: str
    starts: ArrivalProcess
    turns: LengthDist
    gap_s: float
    message: LengthDist
    answer: LengthDist
    max_context: int = 4096
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.gap_s > 0:
            raise ValueError(f"gap_s must be > 0, got {self.gap_s}")

    def draw(self, rng: np.random.Generator, duration_s: float) -> list[RequestDraw]:
        draws: list[RequestDraw] = []
        for index, start in enumerate(self.starts.times(rng, 0.0, duration_s)):
            turns = int(self.turns.sample(rng, 1)[0])
            messages = self.message.sample(rng, turns)
            answers = self.answer.sample(rng, turns)
            gaps = rng.exponential(self.gap_s, size=turns)
            group = f"{self.client}/conv-{index}"
            context, arrival = 0, float(start)
            for message, answer, gap in zip(messages, answers, gaps, strict=True):
                prompt = context + int(message)
                if arrival >= duration_s or prompt + int(answer) > self.max_context:
                    break
                # The whole prompt is the conversation's text: its answer continues it.
                draws.append(RequestDraw(arrival, prompt, int(answer), group, prompt))
                context = prompt + int(answer)
                arrival += float(gap)
        return draws


@dataclass(frozen=True, slots=True)
class DocumentClient:
    """Every request is one of the client's documents followed by a question about it
    (retrieval: the document is the prompt's prefix, its group the document's name).

    `documents`: the groups the client reads, most popular first, each
    `document_tokens` long. A request picks document k (0-based) with probability
    proportional to 1 / (k + 1)^skew: 0 is uniform, 1 is Zipf. `question` is the length
    of the question after the document, `answer` the output's.
    """

    client: str
    arrivals: ArrivalProcess
    documents: tuple[str, ...]
    document_tokens: int
    question: LengthDist
    answer: LengthDist
    skew: float = 0.0
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.documents:
            raise ValueError(f"client {self.client!r} needs at least one document")
        tokens = self.document_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"document_tokens must be an integer >= 1, got {tokens!r}")
        if not (math.isfinite(self.skew) and self.skew >= 0):
            raise ValueError(f"skew must be a finite number >= 0, got {self.skew}")

    def popularity(self) -> np.ndarray:
        """The probability of each document, in the order of `documents`."""
        shares = 1.0 / np.arange(1, len(self.documents) + 1, dtype=float) ** self.skew
        return shares / shares.sum()

    def draw(self, rng: np.random.Generator, duration_s: float) -> list[RequestDraw]:
        times = self.arrivals.times(rng, 0.0, duration_s)
        picks = rng.choice(len(self.documents), size=len(times), p=self.popularity())
        questions = self.question.sample(rng, len(times))
        answers = self.answer.sample(rng, len(times))
        tokens = self.document_tokens
        return [
            RequestDraw(float(t), tokens + int(q), int(a), self.documents[int(k)], tokens)
            for t, k, q, a in zip(times, picks, questions, answers, strict=True)
        ]
