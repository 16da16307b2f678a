"""The GPU benchmark scripts run (on CPU, with `--smoke`), so a session lent a GPU can
run them at once rather than fix them first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[3]


def run_script(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_WAIT_POLICY="PASSIVE")
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_greedy_check_matches_the_reference_on_cpu():
    result = run_script("benchmarks/gpu/greedy_matches_reference.py", "--smoke")
    assert result["all_match"], result["results"]
    # three families in three modes; one of the Triton kernel's (interpreted, slow)
    assert len(result["results"]) == 10


def test_decode_benchmark_reports_every_batch():
    result = run_script(
        "benchmarks/gpu/decode_throughput.py",
        "--smoke",
        "--batches", "1", "4",
        "--prompt", "32",
        "--output", "8",
        "--skip-generate-batch",
    )  # fmt: skip
    assert set(result["tokenfair"]) == {"1", "4"}
    assert all(row["decode_tok_s"] > 0 for row in result["tokenfair"].values())


def test_decode_benchmark_runs_the_triton_kernel():
    result = run_script(
        "benchmarks/gpu/decode_throughput.py",
        "--smoke",
        "--batches", "2",
        "--prompt", "20",
        "--output", "4",
        "--skip-generate-batch",
        "--decode-kernel", "triton",
    )  # fmt: skip
    assert result["decode_kernel"] == "triton" and result["tokenfair"]["2"]["decode_tok_s"] > 0
