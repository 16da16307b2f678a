"""Named workloads: the paper's synthetic suites (SPEC section 7) and larger synthetic ones.

A suite is a list of clients, each with an arrival process, a length distribution and a
weight; `generate_suite(name, seed)` turns it into trace records. Each client draws from
its own random stream (seeded by (seed, client index)), so a suite is deterministic for
a seed and one client's requests do not change when another client is added.

Clients are named `client-0`, `client-1`, ... in the order of the SPEC's table (the
paper's "Client 1", "Client 2", ...). Request ids are `r0`, `r1`, ... in arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenfair.workloads.arrivals import (
    ArrivalProcess,
    LinearRamp,
    OnOff,
    Phases,
    Poisson,
    Uniform,
)
from tokenfair.workloads.client_workload import ClientWorkload
from tokenfair.workloads.documents import DocumentsSpec
from tokenfair.workloads.lengths import ClientLengths, LogNormal, UniformInt, fixed
from tokenfair.workloads.long_neighbor import A10G_CASE, H200_CASE
from tokenfair.workloads.prefixes import (
    ConversationClient,
    DocumentClient,
    RequestDraw,
    SystemPromptClient,
)
from tokenfair.workloads.trace import TraceRecord

ON_OFF_PERIOD_S = 60.0


# What a suite's client may be: independent requests, or requests sharing prefixes.
ClientSpec = ClientWorkload | SystemPromptClient | ConversationClient | DocumentClient


@dataclass(frozen=True, slots=True)
class Suite:
    """A generated workload: requests sorted by arrival, client weights, duration."""

    records: list[TraceRecord]
    weights: dict[str, float] | None  # None: every client weighs 1
    duration_s: float
    name: str = ""


@dataclass(frozen=True, slots=True)
class SuiteDef:
    """A named workload definition (registered in SUITES)."""

    description: str
    duration_s: float
    clients: tuple[ClientSpec, ...]


def generate_workload(
    clients: Sequence[ClientSpec], duration_s: float, seed: int = 0, name: str = ""
) -> Suite:
    """Draw every client's requests in [0, duration_s); merge them by arrival."""
    rows: list[tuple[float, int, RequestDraw]] = []
    for index, spec in enumerate(clients):
        rng = np.random.default_rng([seed, index])
        # Microsecond resolution keeps trace files readable; ties keep client order.
        rows.extend((round(d.arrival_s, 6), index, d) for d in spec.draw(rng, duration_s))
    rows.sort(key=lambda row: (row[0], row[1]))
    records = [
        TraceRecord(
            arrival_s=t,
            client=clients[index].client,
            input_tokens=d.input_tokens,
            output_tokens=d.output_tokens,
            request_id=f"r{n}",
            prefix_group=d.prefix_group,
            prefix_tokens=d.prefix_tokens,
        )
        for n, (t, index, d) in enumerate(rows)
    ]
    weighted = any(c.weight != 1.0 for c in clients)
    weights = {c.client: c.weight for c in clients} if weighted else None
    return Suite(records=records, weights=weights, duration_s=duration_s, name=name)


def _uniform_clients(
    rates: Sequence[float], lengths: ClientLengths, weights: Sequence[float] | None = None
) -> tuple[ClientWorkload, ...]:
    return tuple(
        ClientWorkload(f"client-{i}", Uniform(rate), lengths, weights[i] if weights else 1.0)
        for i, rate in enumerate(rates)
    )


def _named(*specs: tuple[ArrivalProcess, ClientLengths]) -> tuple[ClientWorkload, ...]:
    return tuple(
        ClientWorkload(f"client-{i}", arrivals, lengths)
        for i, (arrivals, lengths) in enumerate(specs)
    )


def _zipf_rates(total_rate: float, num_clients: int, exponent: float) -> list[float]:
    """Split total_rate over clients with shares proportional to 1 / rank^exponent."""
    shares = 1.0 / np.arange(1, num_clients + 1) ** exponent
    return (total_rate * shares / shares.sum()).tolist()


# Chatbot-Arena-like lengths, fitted to shared/traces/arena_vtc_600s.jsonl: inputs have
# median 40 and mean 136, outputs median 211 and mean 256, both capped below 1024.
ARENA_LENGTHS = ClientLengths(
    input=LogNormal(median=44.0, sigma=1.7, low=1, high=1023),
    output=LogNormal(median=180.0, sigma=0.9, low=1, high=1023),
)
ARENA_CLIENTS = 27
ARENA_RATE = 2.5  # requests/s: 1,500 requests in 600 s
ARENA_ZIPF = 0.9  # client popularity in the arena trace falls roughly as 1 / rank^0.9

L256 = fixed(256, 256)
# Questions after a system prompt: short, with short answers.
SHORT_QUESTIONS = ClientLengths(
    input=LogNormal(median=80.0, sigma=0.8, low=8, high=1024),
    output=LogNormal(median=40.0, sigma=0.8, low=4, high=1024),
)


def documents_workload(spec: DocumentsSpec | None = None, seed: int = 0) -> Suite:
    """The `documents` workload for `spec` (defaults: DocumentsSpec()). Deterministic
    for a seed; each client draws from its own stream, as every suite's do."""
    spec = spec or DocumentsSpec()
    return generate_workload(spec.client_specs(), spec.duration_s, seed, "documents")


SUITES: dict[str, SuiteDef] = {
    "overload": SuiteDef(
        "2 clients, uniform 1.5 and 3 req/s, 256/256 tokens: both backlogged",
        360.0,
        _uniform_clients([1.5, 3.0], L256),
    ),
    "proportional": SuiteDef(
        "3 clients, uniform 0.25, 0.5 and 1.5 req/s, 256/256: light clients under their share",
        600.0,
        _uniform_clients([0.25, 0.5, 1.5], L256),
    ),
    "on_off_less": SuiteDef(
        "client-0 0.5 req/s on/off every 60 s, client-1 2 req/s; 256/256",
        600.0,
        _named(
            (OnOff(Uniform(0.5), ON_OFF_PERIOD_S), L256),
            (Uniform(2.0), L256),
        ),
    ),
    "on_off_overload": SuiteDef(
        "client-0 2 req/s on/off every 60 s, client-1 3 req/s; 256/256",
        600.0,
        _named(
            (OnOff(Uniform(2.0), ON_OFF_PERIOD_S), L256),
            (Uniform(3.0), L256),
        ),
    ),
    "poisson_short_long": SuiteDef(
        "Poisson 8 req/s of 64/64 tokens vs Poisson 1.5 req/s of 256/256",
        600.0,
        _named(
            (Poisson(8.0), fixed(64, 64)),
            (Poisson(1.5), fixed(256, 256)),
        ),
    ),
    "poisson_short_long_2": SuiteDef(
        "Poisson 8 req/s of 512/32 tokens vs Poisson 1.5 req/s of 32/512",
        600.0,
        _named(
            (Poisson(8.0), fixed(512, 32)),
            (Poisson(1.5), fixed(32, 512)),
        ),
    ),
    "increase": SuiteDef(
        "client-0 uniform 0.5 req/s, client-1 rising linearly 0.2 -> 2 req/s; 256/256",
        600.0,
        _named(
            (Uniform(0.5), L256),
            (LinearRamp(0.2, 2.0), L256),
        ),
    ),
    "dist_shift": SuiteDef(
        "three 300 s phases: [0.5 on/off, 2], [1, 1], [0.5, 1.5] req/s; 256/256",
        900.0,
        _named(
            (
                Phases(
                    (
                        (300.0, OnOff(Uniform(0.5), ON_OFF_PERIOD_S)),
                        (300.0, Uniform(1.0)),
                        (300.0, Uniform(0.5)),
                    )
                ),
                L256,
            ),
            (
                Phases(((300.0, Uniform(2.0)), (300.0, Uniform(1.0)), (300.0, Uniform(1.5)))),
                L256,
            ),
        ),
    ),
    "overload-multi": SuiteDef(
        "8 clients, uniform 0.4 req/s x3 and 0.6 req/s x5, 256/256",
        360.0,
        _uniform_clients([0.4] * 3 + [0.6] * 5, L256),
    ),
    "overload-weighted": SuiteDef(
        "4 clients, uniform 0.8, 0.8, 1.2, 1.6 req/s with weights 1, 2, 3, 4; 256/256",
        360.0,
        _uniform_clients([0.8, 0.8, 1.2, 1.6], L256, weights=[1.0, 2.0, 3.0, 4.0]),
    ),
    "system-prompt": SuiteDef(
        "10 clients, each with its own system prompt of 1,000-2,000 tokens before short "
        "questions (median 80 tokens, answers 40); Poisson, skewed: 3 and 1.5 req/s, "
        "then 8 light clients at 0.06",
        300.0,
        tuple(
            SystemPromptClient(
                f"client-{i}", Poisson(rate), UniformInt(1000, 2000), SHORT_QUESTIONS
            )
            for i, rate in enumerate([3.0, 1.5] + [0.06] * 8)
        ),
    ),
    "multiturn": SuiteDef(
        "8 clients holding conversations of 2-8 turns, each turn's prompt the whole "
        "conversation so far plus a new message (median 60 tokens, answers 150, turns "
        "20 s apart on average); conversations open at 0.5 and 0.25 per s, then 6 light "
        "clients at 0.05",
        300.0,
        tuple(
            ConversationClient(
                f"client-{i}",
                Poisson(rate),
                turns=UniformInt(2, 8),
                gap_s=20.0,
                message=LogNormal(median=60.0, sigma=0.8, low=4, high=2048),
                answer=LogNormal(median=150.0, sigma=0.7, low=4, high=2048),
                max_context=4096,
            )
            for i, rate in enumerate([0.5, 0.25] + [0.05] * 6)
        ),
    ),
    "arena-x10": SuiteDef(
        "synthetic arena-like trace 10x longer: 27 Poisson clients (Zipf 0.9), 2.5 req/s, "
        "lognormal lengths, 6000 s",
        6000.0,
        tuple(
            ClientWorkload(f"client-{i}", Poisson(rate), ARENA_LENGTHS)
            for i, rate in enumerate(_zipf_rates(ARENA_RATE, ARENA_CLIENTS, ARENA_ZIPF))
        ),
    ),
    "long-neighbor": SuiteDef(
        A10G_CASE.describe() + " (the A10G case; benchmarks/long_neighbor.py)",
        A10G_CASE.duration_s,
        A10G_CASE.client_specs(),
    ),
    "long-neighbor-h200": SuiteDef(
        H200_CASE.describe() + " (the long-context case, a large pool)",
        H200_CASE.duration_s,
        H200_CASE.client_specs(),
    ),
    "documents": SuiteDef(
        DocumentsSpec().describe(),
        DocumentsSpec().duration_s,
        DocumentsSpec().client_specs(),
    ),
}


# Suites whose clients share prompt prefixes (for the prefix cache; not the paper's).
PREFIX_SUITES = ("system-prompt", "multiturn", "documents")
# A tenant flooding long prompts beside chat tenants (experiments/neighbor.py; not the
# paper's: it needs the engine preset's pool, not the paper router's).
NEIGHBOR_SUITES = ("long-neighbor", "long-neighbor-h200")


def generate_suite(name: str, seed: int = 0) -> Suite:
    """Generate the named suite (see SUITES). Deterministic for a seed."""
    try:
        definition = SUITES[name]
    except KeyError:
        known = ", ".join(SUITES)
        raise ValueError(f"unknown suite {name!r}; known suites: {known}") from None
    return generate_workload(definition.clients, definition.duration_s, seed, name)


def suite_descriptions() -> dict[str, str]:
    """Suite name -> one-line description, for `tokenfair trace gen --list`."""
    return {name: definition.description for name, definition in SUITES.items()}
