"""Runs the vLLM plugin's tests (tests/integrations/vllm) inside vLLM's own environments.

vLLM pins its own transformers, so it lives apart from tokenfair's main environment
(`make vllm-env` builds both; `make test` does so first). tokenfair is installed in each,
editable and without its dependencies, as a user installs it beside vLLM (a test checks
that vLLM finds the scheduler class with no help); the suites also set PYTHONPATH:

- `.venv-vllm`: vLLM's CPU build, 0.32: every test, the offline engine and the
  OpenAI server included;
- `.venv-vllm-0.33` and `.venv-vllm-0.34`: vLLM's GPU wheels (no CPU build after
  0.32). Their scheduler runs on CPU, their model runner does not (no CPU kernels in
  those wheels), so only the scheduler-level tests run there (the offline and server
  tests skip, saying so).

From the main environment each environment's suite is one test that passes or fails
with it; it skips, saying why, when the environment is missing, and fails when it is
there but broken.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE_TIMEOUT_S = 1500
ENVIRONMENTS = {
    "0.32": (
        Path(os.environ.get("TOKENFAIR_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python")),
        ["tests/integrations/vllm"],
        {},
    ),
    "0.33": (
        Path(
            os.environ.get(
                "TOKENFAIR_VLLM_NEXT_PYTHON", ROOT / ".venv-vllm-0.33" / "bin" / "python"
            )
        ),
        ["tests/integrations/vllm"],  # the model tests skip, saying why
        # The GPU wheel finds no GPU: vLLM's CPU platform, by name.
        {"VLLM_TARGET_DEVICE": "cpu"},
    ),
    "0.34": (
        Path(
            os.environ.get(
                "TOKENFAIR_VLLM_0_34_PYTHON", ROOT / ".venv-vllm-0.34" / "bin" / "python"
            )
        ),
        ["tests/integrations/vllm"],  # the model tests skip, saying why
        # As 0.33; and 0.34 refuses to build a config on an x86 CPU without Triton
        # drivers unless CUDA_VISIBLE_DEVICES is set and empty (docs/vllm.md).
        {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("minor", list(ENVIRONMENTS))
def test_vllm_plugin_suite_in_vllms_environment(minor):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip(
            "running inside vLLM's environment: tests/integrations/vllm is collected directly"
        )
    python, paths, extra_env = ENVIRONMENTS[minor]
    if not python.exists():
        pytest.skip(f"vLLM {minor} test environment not found at {python}: `make vllm-env`")
    # An environment that exists must work (`make vllm-env` checked it imports): a broken
    # one fails the suite below, with its error, rather than skipping it.
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **extra_env)
    result = subprocess.run(
        [str(python), "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT_S,
    )
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
    assert result.returncode == 0, f"vLLM {minor} plugin suite failed:\n{tail}"
    # The suite ran under the minor it is meant for.
    version = subprocess.run(
        [str(python), "-c", "import vllm; print(vllm.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version.startswith(f"{minor}."), f"expected vLLM {minor}.x at {python}, found {version}"
    print(tail.splitlines()[-1])


@pytest.mark.parametrize("minor", list(ENVIRONMENTS))
def test_vllm_finds_the_scheduler_class_as_the_docs_name_it(minor, tmp_path):
    # `--scheduler-cls tokenfair.integrations.vllm.FairScheduler` as docs/vllm.md writes
    # it: no PYTHONPATH, from a folder outside the checkout.
    python, _, extra_env = ENVIRONMENTS[minor]
    if not python.exists():
        pytest.skip(f"vLLM {minor} test environment not found at {python}: `make vllm-env`")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "from vllm.utils.import_utils import resolve_obj_by_qualname as find\n"
        "for name in ('FairScheduler', 'FairAsyncScheduler'):\n"
        "    print(find('tokenfair.integrations.vllm.' + name).__qualname__)\n"
    )
    done = subprocess.run(
        [str(python), "-c", code],
        cwd=tmp_path,
        env={**env, **extra_env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["FairScheduler", "FairAsyncScheduler"]
