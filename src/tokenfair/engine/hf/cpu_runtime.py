"""Process settings that keep a CPU engine fast on a shared machine.

Two costs dominated profiles of the engine on a busy 2-core machine, and neither is
in the model:

- **OpenMP spin-waiting.** torch's OpenMP runtime (libgomp) lets idle worker threads
  spin for a long while before sleeping. When another process holds one of the cores,
  the spinning thread burns the core the working one needs, and every parallel region
  waits for a descheduled thread: a 64-row linear layer took 20 ms instead of 0.6 ms.
  Sleeping at once (`OMP_WAIT_POLICY=PASSIVE`) cures that but makes every parallel
  region wake a sleeping thread, which at a decode step of small operations costs
  about as much as the operation. `GOMP_SPINCOUNT=3000` (tens of microseconds of
  spinning, then sleep) keeps the next region's thread awake within a step and costs
  a busy machine nothing measurable. libgomp reads it once, when torch is loaded, so
  `tokenfair.engine.hf` sets it (unless the user chose a policy or a spin count)
  before any of its modules imports torch; `short_wait_in_effect` says whether it was
  in time.
- **Page faults on every big temporary.** glibc serves allocations over 32 MiB with
  fresh `mmap`s and unmaps them on free, so each step's gathered KV contexts and
  activations were zero-filled by the kernel again, step after step (gathers ran 3-4x
  slower than into a reused buffer). `keep_freed_memory` makes glibc serve them from
  its heap and keep freed memory for reuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_THRESHOLD_BYTES = 1 << 30  # return freed heap to the OS only beyond 1 GiB at its top

_allocator_tuned = False

# libgomp's spins before an idle thread sleeps (its default is 300,000; PASSIVE is 0).
# Measured on 2 cores: 3,000 gave a small model 4-11% more tokens/s than PASSIVE, the
# same beside a process keeping a core busy, and a 107M-parameter one 1-4% fewer
# (docs/engine.md); 30,000 and up lost 40% beside a busy process.
SPIN_COUNT = 3000


def default_openmp_environment() -> None:
    """Idle OpenMP threads spin briefly, then sleep, unless the user chose otherwise.

    Must run before torch is first imported; later it changes nothing.
    """
    global _policy_set_here
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        _policy_set_here = True


def short_wait_in_effect() -> bool:
    """False when torch was imported before the spin count was set (it then spins long)."""
    chosen = os.environ.get("GOMP_SPINCOUNT") == str(SPIN_COUNT)
    return chosen and not _torch_preloaded


def policy_came_too_late() -> bool:
    """We chose the policy (the user did not) but torch had already been loaded."""
    return _policy_set_here and _torch_preloaded


def keep_freed_memory() -> bool:
    """Serve big allocations from glibc's heap and keep freed memory (once per process).

    Returns whether glibc accepted the settings (False on other C libraries).
    """
    global _allocator_tuned
    if _allocator_tuned:
        return True
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))
    _allocator_tuned = ok
    if not ok:
        log.info("glibc mallopt refused the allocator settings; big temporaries will page-fault")
    return ok


_MADV_HUGEPAGE = 14
_HUGE_PAGE = 2 << 20


def advise_huge_pages(address: int, length: int) -> bool:
    """Ask for transparent huge pages over the 2 MiB-aligned part of a memory range.

    Call it before the memory is first touched: pages already faulted in stay small
    until the kernel's background collapsing gets to them. Returns whether the kernel
    took the advice (False off Linux, or where huge pages are off).
    """
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return False
    begin = -(-address // _HUGE_PAGE) * _HUGE_PAGE
    end = (address + length) // _HUGE_PAGE * _HUGE_PAGE
    if end <= begin:
        return False
    madvise = ctypes.CDLL(name, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise(begin, end - begin, _MADV_HUGEPAGE) == 0


_torch_preloaded = "torch" in sys.modules
_policy_set_here = False
