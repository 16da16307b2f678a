"""The paper's data shipped in the package are the paper's data."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenfair.bundled import BUNDLED_DATA, data_dir


@pytest.mark.parametrize(
    "relative",
    ["traces/arena_vtc_600s.jsonl", "reference/a10g_llama7b_fcfs_arena_measured.jsonl"],
)
def test_bundled_files_are_the_shared_ones_byte_for_byte(shared_dir: Path, relative: str) -> None:
    assert (BUNDLED_DATA / relative).read_bytes() == (shared_dir / relative).read_bytes()


def test_the_bundled_data_is_the_default(tmp_path: Path) -> None:
    assert data_dir(None) == BUNDLED_DATA
    assert data_dir(tmp_path) == tmp_path
