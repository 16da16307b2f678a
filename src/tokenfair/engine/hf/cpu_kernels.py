"""The engine's own CPU kernels: decode attention read in place from the paged KV pool,
and a decoder layer's row-wise operations in one pass each.

Profiles of many decoding requests of mixed lengths put most of a step in attention,
and most of that in *copying* each request's context out of the pool so that SDPA could
read it (index_select per layer and step), then in SDPA reading the copy again. The
kernel in `kernels/paged_decode.c` reads every key and value once, where it lies, as
vLLM's CPU attention does.

`kernels/row_ops.c` does an RMS norm, a SiLU-gated MLP's activation and product, and a
rotary embedding, in one pass over the rows each, where transformers' code makes six,
two and ten passes (and as many dispatches); `cpu_row_ops` puts them into a model.
`kernels/vec.h` holds what both files compute eight floats at a time.

They are plain C with no dependency but libc and pthreads, built into one library in
well under a second with the machine's C compiler on first use, tuned for that
machine's CPU (`-march=native`), and cached under `~/.cache/tokenfair/kernels` (or
`$TOKENFAIR_CACHE_DIR`), keyed by the sources, the flags and the CPU's feature flags.
Where no compiler is found, or `TOKENFAIR_CPU_KERNELS=0` (which also turns off the
packed linear layers of `cpu_linear`), attention falls back to the torch path (gather +
SDPA) and the layers keep transformers' code, which give the same results; the log says
which is used.

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

KERNELS = Path(__file__).with_name("kernels")
SOURCES = (KERNELS / "paged_decode.c", KERNELS / "row_ops.c")
HEADERS = (KERNELS / "vec.h",)
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
    """Compile the kernels (or find them built) and return the shared library's path."""
    sources = [source.read_bytes() for source in (*SOURCES, *HEADERS)]
    key = hashlib.sha256(
        b"\0".join(
            [*sources, " ".join(FLAGS).encode(), compiler.encode(), _cpu_features().encode()]
        )
    ).hexdigest()[:16]
    target = _cache_dir() / f"tokenfair_cpu-{platform.machine()}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes building at once never see half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run(
            [compiler, *FLAGS, "-o", str(built), *map(str, SOURCES), "-lm"],
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
        self._fn = _load(library).tokenfair_paged_decode
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


def relatively_close(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> bool:
    """Same shape, and every difference within `tolerance` of the expected tensor's
    largest magnitude (at least 1): how a fast path is checked against the code it
    replaces on a probe input, before it goes in."""
    scale = expected.abs().max().clamp_min(1.0)
    return got.shape == expected.shape and bool((got - expected).abs().max() <= tolerance * scale)


def cpu_fast_paths_enabled() -> bool:
    """False when `TOKENFAIR_CPU_KERNELS=0`: the engine then runs plain torch on the CPU
    (no C kernel, no packed weights), to rule the fast paths out or measure them."""
    return os.environ.get(DISABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class RowKernels:
    """ctypes bindings of kernels/row_ops.c: row-wise operations over float32 CPU rows.

    Each takes tensors whose rows lie at any stride with unit stride inside a row (a
    view of columns of a wider matrix included) and returns a new contiguous tensor.
    """

    def __init__(self, library: Path) -> None:
        loaded = _load(library)
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        self._rms_norm = loaded.tokenfair_rms_norm
        self._rms_norm.argtypes = [ptr, i64, ptr, ptr, i64, i64, i32, ctypes.c_float, i32]
        self._rms_norm.restype = None
        self._silu_and_mul = loaded.tokenfair_silu_and_mul
        self._silu_and_mul.argtypes = [ptr, i64, ptr, i64, ptr, i64, i64, i32, i32]
        self._silu_and_mul.restype = None
        self._rotary = loaded.tokenfair_rotary
        self._rotary.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i64, i32, i32, i32]
        self._rotary.restype = None

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """`weight * x / sqrt(mean(x^2) + eps)` over the last dimension of 2-D `x`."""
        rows, dim = _rows(x)
        if weight.shape != (dim,) or not _is_cpu_float32(weight) or weight.stride(0) != 1:
            raise ValueError("the norm's weight must be float32 [dim] on the CPU, contiguous")
        out = torch.empty((rows, dim), dtype=torch.float32)
        self._rms_norm(
            x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), dim, rows, dim, eps,
            torch.get_num_threads(),
        )  # fmt: skip
        return out

    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """`silu(gate) * up`, both 2-D and of one shape."""
        rows, width = _rows(gate)
        if _rows(up) != (rows, width):
            raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
        out = torch.empty((rows, width), dtype=torch.float32)
        self._silu_and_mul(
            gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), out.data_ptr(), width,
            rows, width, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`x * cos + rotate_half(x) * sin` for `x` `[tokens, heads, dim]` and each token's
        `cos` and `sin` rows `[tokens, dim]` (one layout for both); rotate_half(x) is
        `(-x[..., dim/2:], x[..., :dim/2])`. Returns a contiguous `[tokens, heads, dim]`."""
        if x.dim() != 3 or not _is_cpu_float32(x) or x.stride(2) != 1 or x.shape[2] % 2:
            raise ValueError("rotary takes float32 CPU [tokens, heads, dim], dim even, unit stride")
        tokens, heads, dim = x.shape
        if _rows(cos) != (tokens, dim) or sin.shape != cos.shape or sin.stride() != cos.stride():
            raise ValueError("cos and sin must be [tokens, dim] rows laid out alike")
        out = torch.empty((tokens, heads, dim), dtype=torch.float32)
        self._rotary(
            x.data_ptr(), x.stride(0), x.stride(1), cos.data_ptr(), sin.data_ptr(), cos.stride(0),
            out.data_ptr(), tokens, heads, dim, torch.get_num_threads(),
        )  # fmt: skip
        return out


def _is_cpu_float32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu"


def _rows(t: torch.Tensor) -> tuple[int, int]:
    if t.dim() != 2 or not _is_cpu_float32(t) or t.stride(1) != 1:
        raise ValueError("row kernels take 2-D float32 CPU tensors with unit stride in a row")
    return t.shape[0], t.shape[1]


@cache
def _load(library: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(library))


@cache
def cpu_kernel_library() -> Path | None:
    """The built library, or None (with the reason logged once) where it cannot be used."""
    if not cpu_fast_paths_enabled():
        log.info("CPU kernels off (%s=0): the engine runs torch's operations", DISABLE_ENV)
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: the engine runs torch's operations (slower)")
        return None
    try:
        library = _build(compiler)
        _load(library)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("CPU kernels unavailable (%s): the engine runs torch's operations", error)
        return None
    log.info("CPU kernels: %s", library)
    return library


@cache
def paged_decode_kernel() -> PagedDecodeKernel | None:
    """The decode attention kernel, or None where the CPU kernels cannot be used."""
    library = cpu_kernel_library()
    return None if library is None else PagedDecodeKernel(library)


@cache
def row_kernels() -> RowKernels | None:
    """The row-wise kernels, or None where the CPU kernels cannot be used."""
    library = cpu_kernel_library()
    return None if library is None else RowKernels(library)
