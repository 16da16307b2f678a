from __future__ import annotations

import os
from pathlib import Path

import pytest

# The GPU kernels (Triton) run in Triton's interpreter on the CPU: a machine without a
# GPU checks what they compute. It must be set before anything imports Triton; a GPU
# machine running the tests against the real kernels sets TRITON_INTERPRET=0.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests read the paper's trace and reference data from ../shared (CI has it there too).
SHARED = Path(
    os.environ.get("TOKENFAIR_SHARED", Path(__file__).resolve().parents[1].parent / "shared")
)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "traces" / "arena_vtc_600s.jsonl").exists():
        pytest.fail(f"shared data not found at {SHARED}; set TOKENFAIR_SHARED")
    return SHARED
