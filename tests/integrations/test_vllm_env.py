"""Runs the vLLM plugin's tests (tests/integrations/vllm) inside vLLM's own environment.

vLLM pins its own transformers, so it lives in `.venv-vllm` (`make vllm-env` builds
it; `make test` does so first), and tokenfair reaches it through PYTHONPATH, never by
being installed there. From the main environment this one test starts that suite and
passes or fails with it; it skips, saying why, when the environment is missing, and
fails when it is there but broken.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("TOKENFAIR_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
SUITE_TIMEOUT_S = 1500


@pytest.mark.slow
def test_vllm_plugin_suite_in_vllms_environment():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip(
            "running inside vLLM's environment: tests/integrations/vllm is collected directly"
        )
    if not VLLM_PYTHON.exists():
        pytest.skip(f"vLLM test environment not found at {VLLM_PYTHON}: `make vllm-env` builds it")
    # An environment that exists must work (`make vllm-env` checked it imports): a broken
    # one fails the suite below, with its error, rather than skipping it.
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    result = subprocess.run(
        [
            str(VLLM_PYTHON),
            "-m",
            "pytest",
            "tests/integrations/vllm",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT_S,
    )
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
    assert result.returncode == 0, f"vLLM plugin suite failed:\n{tail}"
    print(tail.splitlines()[-1])
