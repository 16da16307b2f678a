"""Projections of one input as one matrix: QKV, and the MLP's gate and up.

A transformers attention layer calls `q_proj(x)`, `k_proj(x)` and `v_proj(x)` on the
same `x`, and its MLP `gate_proj(x)` and `up_proj(x)`: five products per layer where
two would do. At a decode step each product reads its whole weight to make a few
rows, so on a GPU every extra launch is a small kernel of its own, and on the CPU
every extra call its own dispatch and packing overhead. `fuse_projections` stacks each
such group's weights into one `nn.Linear` and puts in its place small modules that
share its output: the first of the group to be called with an input computes the
stacked product for all, each returns its own columns (a view, no copy), and the last
one drops the shared result. A member called with any other input (a model that does
not call them in turn on the same tensor) computes its own columns alone, so the
model's answer never depends on the fusion.

The stacked `nn.Linear` is an ordinary layer: the CPU's weight packing (cpu_linear)
packs it like any other.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

# Attribute names of the projections a layer applies to one input, in calling order.
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class StackedProjection(nn.Module):
    """The group's weights as one matrix, and the output its members share."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        first = linears[0]
        with torch.no_grad():
            weight = torch.cat([linear.weight for linear in linears])
            bias = (
                torch.cat([linear.bias for linear in linears]) if first.bias is not None else None
            )
        # Built on the meta device and given the stacked tensors: no initialisation of
        # a fresh matrix, no copy (a 7B model would otherwise fill and copy 9 GB).
        self.linear = nn.Linear(first.in_features, weight.shape[0], bias=False, device="meta")
        self.linear.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            self.linear.bias = nn.Parameter(bias, requires_grad=False)
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None

    def output_for(self, x: torch.Tensor) -> torch.Tensor | None:
        """The stacked product of `x`: computed by the first member to ask; None when
        the last computed was of another input and this member is not the first."""
        if x is self._input:
            return self._output
        return None

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        self._input, self._output = x, self.linear(x)
        return self._output

    def forget(self) -> None:
        self._input = self._output = None


class ProjectionPart(nn.Module):
    """One member's columns of a `StackedProjection` (not a registered child: the
    stacked layer is registered once, on the layer that holds the group)."""

    def __init__(self, stacked: StackedProjection, begin: int, end: int, first: bool, last: bool):
        super().__init__()
        self._stacked = [stacked]  # a list: keeps it out of this module's children
        self.begin, self.end = begin, end
        self.first, self.last = first, last
        self.in_features = stacked.linear.in_features
        self.out_features = end - begin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stacked = self._stacked[0]
        output = None if self.first else stacked.output_for(x)
        if output is None:
            if not self.first:  # called out of turn: its own columns alone
                linear = stacked.linear
                return F.linear(x, linear.weight[self.begin : self.end], _part(linear.bias, self))
            output = stacked.compute(x)
        if self.last:
            stacked.forget()
        return output[..., self.begin : self.end]


def _part(bias: torch.Tensor | None, part: ProjectionPart) -> torch.Tensor | None:
    return None if bias is None else bias[part.begin : part.end]


def fuse_projections(model: nn.Module) -> int:
    """Stack every QKV and gate-up group of `model`, in place; returns how many."""
    fused = 0
    for layer in list(model.modules()):
        for names in GROUPS:
            found = [getattr(layer, name, None) for name in names]
            linears = [m for m in found if isinstance(m, nn.Linear) and type(m) is nn.Linear]
            if len(linears) != len(names):
                continue
            first = linears[0]
            alike = all(
                linear.in_features == first.in_features
                and (linear.bias is None) == (first.bias is None)
                and linear.weight.dtype == first.weight.dtype
                and linear.weight.device == first.weight.device
                for linear in linears
            )
            if not alike:
                continue
            stacked = StackedProjection(linears)
            layer.add_module("stacked_" + "_".join(n.removesuffix("_proj") for n in names), stacked)
            begin = 0
            for i, (name, linear) in enumerate(zip(names, linears, strict=True)):
                end = begin + linear.out_features
                part = ProjectionPart(stacked, begin, end, i == 0, i == len(names) - 1)
                setattr(layer, name, part)
                begin = end
            fused += 1
    if fused:
        log.info("stacked %d projection groups (QKV, gate-up) into single matrices", fused)
    return fused
