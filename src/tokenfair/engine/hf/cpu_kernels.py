"""The engine's own CPU kernel: decode attention read in place from the paged KV pool.

Profiles of many decoding requests of mixed lengths put most of a step in attention,
and most of that in *copying* each request's context out of the pool so that SDPA could
read it (index_select per layer and step), then in SDPA reading the copy again. The
kernel in `kernels/paged_decode.c` reads every key and value once, where it lies, as
vLLM's CPU attention does.

It is plain C with no dependency but libc and pthreads, so it builds in well under a
second with the machine's C compiler on first use, tuned for that machine's CPU
(`-march=native`), and is cached under `~/.cache/tokenfair/kernels` (or
`$TOKENFAIR_CACHE_DIR`), keyed by the source, the flags and the CPU's feature flags.
Where no compiler is found, or `TOKENFAIR_CPU_KERNELS=0` (which also turns off the
packed linear layers of `cpu_linear`), attention falls back to the torch path (gather +
SDPA), which gives the same results; the log says which is used.

ctypes releases the GIL for the call, so a server's event loop keeps running while a
step attends.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "paged_decode.c"
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-pthread", "-std=gnu11")
DISABLE_ENV = "TOKENFAIR_CPU_KERNELS"


def _cpu_features() -> str:
    """The CPU's feature flags: a library built with -march=native is only valid there."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    root = os.environ.get("TOKENFAIR_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "tokenfair"
    return base / "kernels"


def _build(compiler: str) -> Path:
    """Compile the kernel (or find it built) and return the shared library's path."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, " ".join(FLAGS).encode(), compiler.encode(), _cpu_features().encode()])
    ).hexdigest()[:16]
    target = _cache_dir() / f"paged_decode-{platform.machine()}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes building at once never see half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run(
            [compiler, *FLAGS, "-o", str(built), str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:2000]}")
        os.replace(built, target)
    return target


class PagedDecodeKernel:
    """ctypes binding of `tokenfair_paged_decode` (see kernels/paged_decode.c)."""

    def __init__(self, library: Path) -> None:
        self.library = library
        self._fn = ctypes.CDLL(str(library)).tokenfair_paged_decode
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        self._fn.argtypes = [
            *(ptr, i64, i64),  # query, its request and head strides
            *(ptr, ptr, i64),  # keys, values, kv-head stride
            *(ptr, i64, ptr, i64),  # block tables, their row stride, lengths, requests
            ptr,  # out
            *(i32, i32, i32, i32, i32),  # heads, kv heads, head dim, block size, window
            ctypes.c_float,  # scale
            i32,  # threads
        ]
        self._fn.restype = ctypes.c_int

    def __call__(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        block_size: int,
        scale: float,
        window: int | None = None,
        threads: int | None = None,
    ) -> torch.Tensor:
        """Attention output `[B, heads, head_dim]` for single queries `[B, heads, head_dim]`.

        `keys`/`values`: a layer's pool views `[kv_heads, slots, head_dim]`;
        `block_tables`: int64 `[B, max_blocks]`, each request's blocks in order;
        `context_lens`: int64 `[B]`, the keys each query sees (its own included).
        A `window` keeps only the last `window` keys, as sliding-window layers do.
        """
        requests, heads, head_dim = query.shape
        kv_heads, _, kv_dim = keys.shape
        for name, t in (("query", query), ("keys", keys), ("values", values)):
            if t.dtype != torch.float32 or t.device.type != "cpu" or t.stride(-1) != 1:
                raise ValueError(f"{name} must be float32 on the CPU with unit stride in head_dim")
        if keys.stride() != values.stride() or keys.stride(1) != head_dim or kv_dim != head_dim:
            raise ValueError("keys and values must be [kv_heads, slots, head_dim] pool views")
        tables = block_tables.contiguous()
        lens = context_lens.contiguous()
        if tables.dtype != torch.int64 or lens.dtype != torch.int64 or lens.numel() != requests:
            raise ValueError("block tables and context lengths must be int64, one row a query")
        out = torch.empty((requests, heads, head_dim), dtype=torch.float32)
        status = self._fn(
            query.data_ptr(),
            query.stride(0),
            query.stride(1),
            keys.data_ptr(),
            values.data_ptr(),
            keys.stride(0),
            tables.data_ptr(),
            tables.stride(0) if tables.dim() == 2 else 0,
            lens.data_ptr(),
            requests,
            out.data_ptr(),
            heads,
            kv_heads,
            head_dim,
            block_size,
            window or 0,
            scale,
            threads or torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"paged decode kernel failed ({status})")
        return out


def cpu_fast_paths_enabled() -> bool:
    """False when `TOKENFAIR_CPU_KERNELS=0`: the engine then runs plain torch on the CPU
    (no C kernel, no packed weights), to rule the fast paths out or measure them."""
    return os.environ.get(DISABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@cache
def paged_decode_kernel() -> PagedDecodeKernel | None:
    """The built kernel, or None (with the reason logged once) where it cannot be used."""
    if not cpu_fast_paths_enabled():
        log.info(
            "CPU attention kernel off (%s=0): decode attention gathers with torch", DISABLE_ENV
        )
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: decode attention gathers with torch (slower)")
        return None
    try:
        kernel = PagedDecodeKernel(_build(compiler))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning(
            "CPU attention kernel unavailable (%s): decode attention gathers with torch", error
        )
        return None
    log.info("CPU attention kernel: %s", kernel.library)
    return kernel
