"""The paper's data shipped inside the package, laid out as the shared/ folder is.

`tokenfair demo` and `tokenfair experiment paper` read the arena trace from here unless
`--shared` names another folder, so an installed wheel runs them from any directory:
the trace is 135 KB, and the measured FCFS run of it on the paper's A10G, which the
report compares the simulator with, 200 KB. The copies are byte for byte those of the
paper's artifact (a test compares them with shared/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BUNDLED_DATA = Path(__file__).with_name("data")


@dataclass(frozen=True, slots=True)
class Dataset:
    """A file shipped in the package, by a short name (`tokenfair data`)."""

    name: str
    file: str  # under data/, as under shared/
    what: str

    @property
    def path(self) -> Path:
        return BUNDLED_DATA / self.file


DATASETS = (
    Dataset(
        "arena",
        "traces/arena_vtc_600s.jsonl",
        "the paper's real workload (Chatbot Arena): 27 clients over 600 s, replayed by "
        "`demo` and `experiment paper`",
    ),
    Dataset(
        "a10g-fcfs-arena",
        "reference/a10g_llama7b_fcfs_arena_measured.jsonl",
        "the arena trace served FCFS on the paper's A10G (Llama-7B), with each request's "
        "measured ttft_s and latency_s: what the simulator is validated against",
    ),
)


def dataset(name: str) -> Dataset:
    """The shipped dataset `name`; ValueError naming the others."""
    for found in DATASETS:
        if found.name == name:
            return found
    known = ", ".join(d.name for d in DATASETS)
    raise ValueError(f"no shipped dataset {name!r}; the shipped ones: {known}")


def data_dir(shared: Path | None) -> Path:
    """The folder holding traces/ and reference/: `shared` when given, else the bundled."""
    return BUNDLED_DATA if shared is None else shared
