"""The CPU runtime settings: idle OpenMP threads spin briefly, then sleep, unless the
user chose a policy or a spin count, the check notices when torch was loaded first, and glibc takes the allocator
settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

SRC = str(Path(__file__).resolve().parents[3] / "src")
PROBE = (
    "import os, sys\n"
    "{first}\n"
    "from tokenfair.engine.hf import cpu_runtime\n"
    "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'),"
    " cpu_runtime.short_wait_in_effect(),"
    " cpu_runtime.policy_came_too_late())\n"
)


def probe(first: str = "", **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        env={**clean, "PYTHONPATH": SRC, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_a_short_spin_is_the_default_before_torch_loads():
    assert probe() == "None 3000 True False"


def test_a_policy_the_user_chose_is_kept():
    assert probe(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE None False False"
    assert probe(OMP_WAIT_POLICY="PASSIVE") == "PASSIVE None False False"
    assert probe(GOMP_SPINCOUNT="1000") == "None 1000 False False"


def test_torch_loaded_first_is_noticed():
    assert probe(first="import torch") == "None 3000 False True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_glibc_takes_the_allocator_settings():
    from tokenfair.engine.hf.cpu_runtime import keep_freed_memory

    assert keep_freed_memory() is True


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage").exists(), reason="no transparent huge pages"
)
def test_the_kv_pool_asks_for_huge_pages_and_starts_zeroed():
    import torch

    from tokenfair.engine.hf.cpu_runtime import advise_huge_pages
    from tokenfair.engine.hf.kv_pool import KVPool, KVShape

    buffer = torch.empty(6 << 20, dtype=torch.uint8)
    assert advise_huge_pages(buffer.data_ptr(), buffer.numel()) is True
    # Less than one aligned 2 MiB page inside the range: nothing to advise.
    assert advise_huge_pages(buffer.data_ptr() + 1, 1 << 20) is False
    pool = KVPool(KVShape(2, 2, 64, torch.float32), num_blocks=512, block_size=16, device="cpu")
    assert not pool.data.any(), "the pool's memory is zeroed after the advice"
