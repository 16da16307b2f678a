"""The `documents` workload: clients asking questions about long documents (retrieval).

Each client has a few documents (`client-N/doc-K`; optionally some shared by every
client, `shared/doc-K`); a request is one of them, as the prompt's prefix, followed by
a question. Which client goes next decides what the prefix cache can reuse, so it is
the workload of the fairness-efficiency frontier (benchmarks/frontier.py).
`DocumentsSpec` holds the options; `tokenfair.workloads.suites.documents_workload`
draws the trace, and `tokenfair trace gen documents` writes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenfair.workloads.arrivals import Poisson
from tokenfair.workloads.lengths import LengthDist, UniformInt
from tokenfair.workloads.prefixes import DocumentClient


class DocumentsOptionError(ValueError):
    """A `documents` workload option is out of range; `option` is the parameter's name."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"{option} {problem}")
        self.option = option
        self.problem = problem


def _whole(option: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DocumentsOptionError(option, f"must be a whole number >= {low}, got {value!r}")


def _positive(option: str, value: float, low: float = 0.0, *, allow_low: bool = False) -> None:
    ok = math.isfinite(value) and (value >= low if allow_low else value > low)
    if not ok:
        bound = f">= {low:g}" if allow_low else f"> {low:g}"
        raise DocumentsOptionError(option, f"must be a finite number {bound}, got {value!r}")


# Requests per second of each client but the busiest (Poisson): backlogged on the
# simulated A10G (a10g-llama-7b) under every policy. With the other defaults (six
# clients, client-0 2.5x, 2,500-token documents, 50-150-token questions, 100-300-token
# answers) they ask for about 10,500 tokens/s, several times what the A10G serves on
# this work (900-2,300 tokens/s with a pool holding a fifth of the documents, 2,800 with
# all of them; docs/experiments.md, "The fairness-efficiency frontier").
DOCUMENTS_RATE = 0.5
DOCUMENT_QUESTION = UniformInt(50, 150)  # tokens of the question after the document
DOCUMENT_ANSWER = UniformInt(100, 300)  # tokens of the answer


@dataclass(frozen=True, slots=True)
class DocumentsSpec:
    """Retrieval-style work: clients asking questions about long documents.

    Every client has `documents_per_client` documents of `document_tokens` tokens; the
    first `shared_documents` of them are the same for every client (groups
    `shared/doc-K`), the others its own (`client-N/doc-K`). A request is a document (the
    prompt's prefix) and a question (`question` tokens), answered in `answer` tokens;
    document k of a client's list (shared ones first) is picked with probability
    proportional to 1 / (k + 1)^skew. Requests arrive as Poisson at `rate` per second,
    `busy_factor` times that for `client-0`, the busiest. Invalid values raise
    `DocumentsOptionError` naming the parameter.
    """

    clients: int = 6
    documents_per_client: int = 4
    document_tokens: int = 2500
    skew: float = 0.0
    busy_factor: float = 2.5
    rate: float = DOCUMENTS_RATE
    question: LengthDist = DOCUMENT_QUESTION
    answer: LengthDist = DOCUMENT_ANSWER
    shared_documents: int = 0
    duration_s: float = 300.0

    def __post_init__(self) -> None:
        _whole("clients", self.clients, 1)
        _whole("documents_per_client", self.documents_per_client, 1)
        _whole("document_tokens", self.document_tokens, 1)
        _positive("skew", self.skew, allow_low=True)
        _positive("busy_factor", self.busy_factor)
        _positive("rate", self.rate)
        _positive("duration_s", self.duration_s)
        _whole("shared_documents", self.shared_documents, 0)
        if self.shared_documents > self.documents_per_client:
            raise DocumentsOptionError(
                "shared_documents",
                f"must be at most documents_per_client ({self.documents_per_client}), "
                f"got {self.shared_documents}",
            )

    def documents_of(self, index: int) -> tuple[str, ...]:
        """Client `index`'s documents, most popular first: the shared ones, then its own."""
        shared = [f"shared/doc-{k}" for k in range(self.shared_documents)]
        own = [
            f"client-{index}/doc-{k}"
            for k in range(self.documents_per_client - self.shared_documents)
        ]
        return (*shared, *own)

    @property
    def distinct_documents(self) -> int:
        return self.shared_documents + self.clients * (
            self.documents_per_client - self.shared_documents
        )

    @property
    def footprint_tokens(self) -> int:
        """Tokens of every distinct document: what a cache holding them all needs."""
        return self.distinct_documents * self.document_tokens

    def client_specs(self) -> tuple[DocumentClient, ...]:
        return tuple(
            DocumentClient(
                f"client-{i}",
                Poisson(self.rate * (self.busy_factor if i == 0 else 1.0)),
                self.documents_of(i),
                self.document_tokens,
                self.question,
                self.answer,
                skew=self.skew,
            )
            for i in range(self.clients)
        )

    def describe(self) -> str:
        shared = f", {self.shared_documents} of them shared by all" if self.shared_documents else ""
        return (
            f"{self.clients} clients asking about {self.documents_per_client} documents "
            f"each{shared} ({self.document_tokens:,} tokens; popularity skew "
            f"{self.skew:g}) with short questions; Poisson {self.rate:g} req/s each, "
            f"client-0 {self.busy_factor:g}x: backlogged"
        )
