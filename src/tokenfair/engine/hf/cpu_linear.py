"""Linear layers on prepacked oneDNN weights, for float32 models on the CPU.

`torch.nn.functional.linear` on the CPU calls BLAS, which repacks the weight matrix
into its own blocked layout on every call. For the few-dozen-row inputs of decode steps
that repacking is a large share of the work: on the benchmark's 107M-parameter Llama
(2 cores, AVX2) a 64 x 1024 by 1024 x 2816 product ran at 40-70 GFLOP/s through
`F.linear` and at 65-95 through oneDNN with the weight packed once, ahead of time; vLLM's
CPU backend packs its weights the same way.

`pack_linear_layers` swaps every `nn.Linear` of a model for a `PackedLinear` holding
the packed weight, and drops the dense copy so the weights are not held twice. A weight
that another module shares (an output layer tied to the input embedding) is kept dense
for that module and packed as a copy. The packing ops are torch's own (the ones
`torch.compile` uses for CPU inference, `torch.ops.mkldnn`); where they are missing, or
a packed layer does not reproduce `F.linear` on a probe input, that layer and the ones
after it stay as they are, and the log says so.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from tokenfair.engine.hf.cpu_kernels import cpu_fast_paths_enabled, relatively_close

log = logging.getLogger(__name__)

_TOLERANCE = 1e-4  # relative, on a probe input: packing reorders sums, nothing more


def _ops_available() -> bool:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and mkldnn is not None
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Module):
    """`y = x W^T + b` with W in oneDNN's packed layout (float32, CPU)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed_weight, self.bias, "none", [], ""
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def _matches(linear: nn.Linear, packed: PackedLinear) -> bool:
    probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = F.linear(probe, linear.weight, linear.bias)
        got = packed(probe)
    return relatively_close(got, expected, _TOLERANCE)


def pack_linear_layers(model: nn.Module) -> int:
    """Replace the float32 CPU `nn.Linear` layers of `model` by `PackedLinear`, in place.

    Returns how many were packed (0 where the ops are unavailable, or with
    `TOKENFAIR_CPU_KERNELS=0`).
    """
    if not cpu_fast_paths_enabled():
        log.info("CPU fast paths off (TOKENFAIR_CPU_KERNELS=0): linear layers use torch's BLAS")
        return 0
    if not _ops_available():
        log.info("oneDNN weight packing unavailable: linear layers use torch's BLAS path")
        return 0
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
        and child.weight.dtype == torch.float32
        and child.weight.device.type == "cpu"
    ]
    # One layer at a time, so the weights are never all held twice; each packed layer
    # is checked before it goes in, so stopping half way still leaves a correct model.
    for count, (parent, name, linear) in enumerate(targets):
        try:
            packed = PackedLinear(linear)
        except RuntimeError as error:
            log.warning(
                "oneDNN weight packing failed (%s); the other layers stay as they are", error
            )
            return count
        if not _matches(linear, packed):
            log.warning(
                "a oneDNN packed layer disagrees with F.linear; the others stay as they are"
            )
            return count
        setattr(parent, name, packed)  # the dense weight goes unless another module holds it
    return len(targets)
