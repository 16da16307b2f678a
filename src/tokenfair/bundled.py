"""The paper's data shipped inside the package, laid out as the shared/ folder is.

`tokenfair demo` and `tokenfair experiment paper` read the arena trace from here unless
`--shared` names another folder, so an installed wheel runs them from any directory:
the trace is 135 KB, and the measured FCFS run of it on the paper's A10G, which the
report compares the simulator with, 200 KB. The copies are byte for byte those of the
paper's artifact (a test compares them with shared/).
"""

from __future__ import annotations

from pathlib import Path

BUNDLED_DATA = Path(__file__).with_name("data")


def data_dir(shared: Path | None) -> Path:
    """The folder holding traces/ and reference/: `shared` when given, else the bundled."""
    return BUNDLED_DATA if shared is None else shared
