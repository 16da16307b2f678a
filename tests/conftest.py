from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests read the paper's trace and reference data from ../shared (CI has it there too).
SHARED = Path(
    os.environ.get("TOKENFAIR_SHARED", Path(__file__).resolve().parents[1].parent / "shared")
)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "traces" / "arena_vtc_600s.jsonl").exists():
        pytest.fail(f"shared data not found at {SHARED}; set TOKENFAIR_SHARED")
    return SHARED
