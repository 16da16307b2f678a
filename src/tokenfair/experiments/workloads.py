"""Workloads: the requests of one experiment and how their fairness is measured.

A workload is a paper suite (measured over the suite's own duration), a trace file
(measured up to its last arrival unless told), or the paper's arena trace (600 s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenfair.fairness.metrics import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S
from tokenfair.workloads.suites import NEIGHBOR_SUITES, PREFIX_SUITES, SUITES, generate_suite
from tokenfair.workloads.trace import TraceRecord, read_trace

ARENA = "arena"
ARENA_TRACE = Path("traces") / "arena_vtc_600s.jsonl"
ARENA_DURATION_S = 600.0
PAPER_SUITES = tuple(
    name
    for name in SUITES
    if name != "arena-x10" and name not in PREFIX_SUITES and name not in NEIGHBOR_SUITES
)

# Which of the paper's results each workload stands for (SPEC section 7): the real-trace
# table, and the synthetic workloads' figures, named by what they show.
PAPER_RESULTS = {
    ARENA: "the real-trace table (Chatbot Arena, 27 clients)",
    "overload": "the figure of two clients in overload (1.5 and 3 req/s)",
    "proportional": "the figure of clients asking for less than their share",
    "on_off_less": "the figure of an ON/OFF client asking for less than its share",
    "on_off_overload": "the figure of an ON/OFF client in overload",
    "poisson_short_long": "the figure of Poisson arrivals, short and long requests",
    "poisson_short_long_2": "the figure of Poisson arrivals, long prompts and long outputs",
    "increase": "the figure of a client whose rate rises",
    "dist_shift": "the figure of a workload shifting through three phases",
    "overload-multi": "the figure of eight clients in overload",
    "overload-weighted": "the weighted VTC figure (weights 1, 2, 3, 4)",
}


@dataclass(frozen=True, slots=True)
class Workload:
    """The requests of one experiment and the parameters its metrics are measured with.

    `duration_s` is the metrics' T (ticks span [warmup, T]); `weights` are the clients'
    weights, used by weighted policies and by the metrics (service / weight).
    """

    name: str
    records: tuple[TraceRecord, ...]
    duration_s: float
    description: str = ""
    weights: dict[str, float] | None = None
    window_s: float = DEFAULT_WINDOW_S
    warmup_s: float = DEFAULT_WARMUP_S

    @property
    def clients(self) -> list[str]:
        return sorted({r.client for r in self.records})


def suite_workload(name: str, seed: int = 0) -> Workload:
    """A named suite as a workload measured over its own duration."""
    suite = generate_suite(name, seed)
    return Workload(
        name=name,
        records=tuple(suite.records),
        duration_s=suite.duration_s,
        description=SUITES[name].description,
        weights=suite.weights,
    )


def trace_workload(
    path: Path,
    name: str | None = None,
    duration_s: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    warmup_s: float = DEFAULT_WARMUP_S,
    weights: dict[str, float] | None = None,
) -> Workload:
    """A trace file as a workload; T defaults to its last arrival in whole seconds."""
    records = read_trace(path)
    if not records:
        raise ValueError(f"trace {path} holds no requests")
    if duration_s is None:
        duration_s = float(math.floor(max(r.arrival_s for r in records)))
    clients = {r.client for r in records}
    return Workload(
        name=name or path.stem,
        records=tuple(records),
        duration_s=duration_s,
        description=f"{len(records):,} requests from {len(clients)} clients ({path.name})",
        weights=weights,
        window_s=window_s,
        warmup_s=warmup_s,
    )


def arena_workload(shared_dir: Path) -> Workload:
    path = shared_dir / ARENA_TRACE
    if not path.exists():
        raise FileNotFoundError(f"arena trace not found at {path}: pass the shared/ folder")
    workload = trace_workload(path, ARENA, duration_s=ARENA_DURATION_S)
    return Workload(
        name=ARENA,
        records=workload.records,
        duration_s=workload.duration_s,
        description="The paper's real trace from Chatbot Arena, 27 clients over 600 s",
    )


def paper_workloads(shared_dir: Path, suites: Sequence[str] = PAPER_SUITES) -> list[Workload]:
    """The arena trace first (its table is the headline), then the synthetic suites."""
    return [arena_workload(shared_dir)] + [suite_workload(name) for name in suites]
