"""RMS norms, SiLU-gated MLPs and rotary embeddings of a float32 CPU model on the
engine's row kernels.

A profile of 256 decoding requests on a small Llama put a quarter of the step outside
attention and the linear layers, in element-wise tensor operations: each RMS norm is six
of them, each MLP's `silu(gate) * up` two, each rotary embedding ten, each a pass over
memory and a dispatch of its own, and at decode sizes torch runs them on one core.
`fuse_row_ops` makes each one call of `cpu_kernels.RowKernels`:

- a module named `...RMSNorm` with a `weight` of the hidden size and a
  `variance_epsilon` (Llama, Mistral, Qwen2 and Qwen3, Phi-3 write it that way)
  becomes a `RowKernelRMSNorm`;
- a module with `gate_proj`, `up_proj` and `down_proj` whose `act_fn` is SiLU becomes a
  `RowKernelGatedMLP` holding the same children (stacked projections included);
- the rotary embedding: transformers' attention layers call their modeling module's
  `apply_rotary_pos_emb` function by name, so that module-level function is wrapped
  (`RowKernelRotary`); the wrapper takes the kernel path only inside an engine step
  (`engine_step`), so any other model of the family in the process, a test's reference
  included, runs transformers' own code.

Like the packed linear layers, each swapped layer or function is first run beside the
original on a probe input and kept only where the two agree (a norm that adds one to its
weight, as Gemma's does, or any other variant, stays as it is); inputs the kernels do
not take (another dtype or device, a gradient to keep, a partial rotary) go to the
original code.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import cast

import torch
from torch import nn

from tokenfair.engine.hf.cpu_kernels import RowKernels, relatively_close, row_kernels

log = logging.getLogger(__name__)

_TOLERANCE = 1e-5  # relative, on a probe input: a different summation order, nothing more
_ROTARY = "apply_rotary_pos_emb"

_in_engine_step: ContextVar[bool] = ContextVar("tokenfair_engine_step", default=False)


@contextmanager
def engine_step() -> Iterator[None]:
    """Within it, wrapped rotary functions take the kernel path (the executor's forward)."""
    token = _in_engine_step.set(True)
    try:
        yield
    finally:
        _in_engine_step.reset(token)


def _takes(x: torch.Tensor) -> bool:
    return (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.dim() >= 1
        and x.stride(-1) == 1
        and not (x.requires_grad and torch.is_grad_enabled())
    )


class RowKernelRMSNorm(nn.Module):
    """The norm's own weight and epsilon, applied by the row kernel."""

    def __init__(self, norm: nn.Module, kernels: RowKernels) -> None:
        super().__init__()
        weight = norm.weight
        assert isinstance(weight, torch.Tensor)  # _is_rms_norm checked it
        self.weight = weight
        self.variance_epsilon = cast(float, norm.variance_epsilon)
        self._kernels = kernels
        self._original = [norm]  # a list: not a child, its weight is registered once here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _takes(x):
            return self._original[0](x)
        rows = x.reshape(-1, x.shape[-1])
        return self._kernels.rms_norm(rows, self.weight, self.variance_epsilon).view(x.shape)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, row kernel"


class RowKernelGatedMLP(nn.Module):
    """`down(silu(gate(x)) * up(x))`, the middle in one pass; the original's children."""

    def __init__(self, mlp: nn.Module, kernels: RowKernels) -> None:
        super().__init__()
        for name, child in mlp.named_children():
            if name != "act_fn":
                self.add_module(name, child)
        # The same three, typed (a tuple registers nothing: they are children above).
        self._projections: tuple[nn.Module, nn.Module, nn.Module] = (
            cast(nn.Module, mlp.gate_proj),
            cast(nn.Module, mlp.up_proj),
            cast(nn.Module, mlp.down_proj),
        )
        self._kernels = kernels
        self._original = [mlp]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _takes(x):
            return self._original[0](x)
        gate_proj, up_proj, down_proj = self._projections
        gate, up = gate_proj(x), up_proj(x)
        width = gate.shape[-1]
        middle = self._kernels.silu_and_mul(gate.reshape(-1, width), up.reshape(-1, width))
        return down_proj(middle.view(*x.shape[:-1], width))


class RowKernelRotary:
    """A modeling module's `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`, on the
    row kernel for the engine's packed step (batch 1, full-width rotary, float32 CPU)."""

    def __init__(self, original: Callable, kernels: RowKernels) -> None:
        self.original = original
        self._kernels = kernels

    def __call__(self, q, k, cos, sin, unsqueeze_dim: int = 1, *args, **kwargs):
        if (
            args
            or kwargs
            or not (_in_engine_step.get() and self._takes(q, k, cos, sin, unsqueeze_dim))
        ):
            return self.original(q, k, cos, sin, unsqueeze_dim, *args, **kwargs)
        angles = cos[0], sin[0]
        q_out = self._kernels.rotary(q[0].transpose(0, 1), *angles).transpose(0, 1)[None]
        k_out = self._kernels.rotary(k[0].transpose(0, 1), *angles).transpose(0, 1)[None]
        return q_out, k_out

    @staticmethod
    def _takes(q, k, cos, sin, unsqueeze_dim: int) -> bool:
        """[1, heads, tokens, dim] queries and keys (dim even), [1, tokens, dim] angles."""
        if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3:
            return False
        tokens, dim = q.shape[2], q.shape[3]
        return (
            dim % 2 == 0
            and q.shape[0] == k.shape[0] == cos.shape[0] == 1
            and k.shape[2:] == q.shape[2:]
            and cos.shape[1:] == (tokens, dim) == sin.shape[1:]
            and sin.stride() == cos.stride()
            and all(_takes(t) for t in (q, k, cos, sin))
        )


def _is_rms_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and not isinstance(module, RowKernelRMSNorm)
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def _is_silu_gated_mlp(module: nn.Module) -> bool:
    act = getattr(module, "act_fn", None)
    return all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj")) and (
        isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"
    )


def _agrees(original: Callable, swapped: Callable, *probe: torch.Tensor) -> bool:
    """Both give the same answer (to float32 rounding) on the probe inputs; a layer or
    function that cannot even take them is not the kernels' either."""
    try:
        with torch.inference_mode(), engine_step():
            expected, got = original(*probe), swapped(*probe)
    except (TypeError, ValueError, RuntimeError, IndexError):
        return False
    if isinstance(expected, torch.Tensor):
        expected, got = (expected,), (got,)
    return len(expected) == len(got) and all(
        relatively_close(g, e, _TOLERANCE) for g, e in zip(got, expected, strict=True)
    )


def _width(module: nn.Module) -> int | None:
    """The input width a swapped layer takes: the norm's size, or the MLP's input."""
    if _is_rms_norm(module):
        return cast(torch.Tensor, module.weight).shape[0]
    return getattr(module.gate_proj, "in_features", None)


def _probe_rows(width: int) -> torch.Tensor:
    return torch.randn(3, width, generator=torch.Generator().manual_seed(0))


def _rotary_agrees(wrapped: RowKernelRotary) -> bool:
    """The wrapper and the original agree on a probe (queries with 4 heads, keys with 2)."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, heads, 5, 8, generator=generator) for heads in (4, 2))
    cos, sin = (torch.randn(1, 5, 8, generator=generator) for _ in range(2))
    return _agrees(wrapped.original, wrapped, q, k, cos, sin)


def wrap_rotary(model: nn.Module, kernels: RowKernels) -> int:
    """Wrap the rotary function of each modeling module the model's layers come from;
    returns how many modules' functions are (now or already) wrapped."""
    wrapped = 0
    for name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(name)
        function = getattr(module, _ROTARY, None)
        if isinstance(function, RowKernelRotary):
            wrapped += 1
        elif callable(function):
            candidate = RowKernelRotary(function, kernels)
            if _rotary_agrees(candidate):
                setattr(module, _ROTARY, candidate)
                wrapped += 1
            else:
                log.info("%s.%s differs from the row kernel's and keeps its code", name, _ROTARY)
    return wrapped


def fuse_row_ops(model: nn.Module) -> int:
    """Swap the model's RMS norms and SiLU-gated MLPs for row-kernel ones, in place, and
    wrap its rotary function; returns how many layers and functions (0 where the CPU
    kernels are unavailable or turned off)."""
    kernels = row_kernels()
    if kernels is None:
        return 0
    swapped = wrap_rotary(model, kernels)
    refused = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_rms_norm(child):
                replacement: nn.Module = RowKernelRMSNorm(child, kernels)
            elif _is_silu_gated_mlp(child):
                replacement = RowKernelGatedMLP(child, kernels)
            else:
                continue
            width = _width(child)
            if width is None or not _agrees(child, replacement, _probe_rows(width)):
                refused += 1
                continue
            setattr(parent, name, replacement)
            swapped += 1
    if refused:
        log.info("%d norm or MLP layers differ from the row kernels' and keep their code", refused)
    if swapped:
        log.info("%d norms, MLPs and rotary functions run on the CPU row kernels", swapped)
    return swapped
