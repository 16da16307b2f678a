"""Static-shape decode steps, replayed as CUDA graphs on a GPU.

A decode step on a GPU is launch-bound at small batches: hundreds of small kernels per
layer, each queued by Python. A CUDA graph records them once and replays them in one
launch. Graphs need fixed shapes and fixed tensor addresses, so a pure-decode step is
padded to a *bucket*: the batch to the next size in `BATCH_BUCKETS`, every context to
one width, a multiple of `WIDTH_STEP`. Padding rows decode a dummy token that writes
its key/value into a scratch slot no request owns and attends to that slot only; their
logits are dropped. Each (batch, width) bucket owns static input buffers; a step
copies its indices into them and replays the bucket's graph.

The same static path runs eagerly where graphs are not available (on CPU, `capture`
False), so its padding and bookkeeping are tested without a GPU; if a capture fails,
the buckets captured before it keep replaying and the others run eagerly. Prefill and
mixed steps always run eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenfair.engine.hf.step_layout import DecodeGroup, DecodeTables, StepLayout
from tokenfair.engine.hf.triton_decode import partitions_for

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
WIDTH_STEP = 256

Forward = Callable[[StepLayout], torch.Tensor]  # layout -> logits of every packed row


def bucket_batch(size: int) -> int | None:
    """The smallest batch bucket holding `size` decodes, or None above the largest."""
    return next((b for b in BATCH_BUCKETS if b >= size), None)


def bucket_width(width: int) -> int:
    return -(-width // WIDTH_STEP) * WIDTH_STEP


@dataclass(slots=True)
class _Bucket:
    layout: StepLayout  # static buffers: the graph reads its inputs from these
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # the graph's output buffer


class StaticDecode:
    """Runs pure-decode steps at bucketed shapes; `capture` turns them into CUDA graphs."""

    def __init__(self, forward: Forward, scratch_slot: int, device: torch.device, capture: bool):
        self.forward = forward
        self.scratch_slot = scratch_slot
        self.device = device
        self.capture = capture and device.type == "cuda"
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """The (batch, width) shapes run so far."""
        return list(self._buckets)

    def accepts(self, layout: StepLayout) -> bool:
        """Pure decodes (no multi-token chunk), every one sampling, within the buckets."""
        return (
            not layout.chunks
            and (bool(layout.groups) or layout.decode_tables is not None)
            and len(layout.samplers) == layout.num_tokens
            and bucket_batch(layout.num_tokens) is not None
        )

    def run(self, layout: StepLayout) -> torch.Tensor:
        """Logits [decodes, vocab] for an accepted layout, rows in its sampler order."""
        size = layout.num_tokens
        batch = bucket_batch(size)
        assert batch is not None
        tables = layout.decode_tables
        # Groups and tables both run longest first.
        width = bucket_width(tables.longest if tables is not None else layout.groups[0].width)
        bucket = self._buckets.get((batch, width))
        if bucket is None:
            static = self._static_layout(batch, width, tables)
            bucket = self._buckets[(batch, width)] = _Bucket(static)
        self._fill(bucket.layout, layout, width)
        if bucket.graph is None and self.capture:
            self._record(bucket)
        if bucket.graph is None:
            return self.forward(bucket.layout)[:size]
        assert bucket.logits is not None
        bucket.graph.replay()
        return bucket.logits[:size]

    def _static_layout(self, batch: int, width: int, kernel: DecodeTables | None) -> StepLayout:
        """A bucket's buffers: decode groups of gathered slots, or, where the step's
        decodes are read by a kernel, block tables (`width` positions' worth)."""

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=self.device)

        groups, tables = [], None
        if kernel is None:
            groups = [DecodeGroup(0, batch, width, zeros(batch), zeros(batch * width))]
        else:
            bs = kernel.block_size
            tables = DecodeTables(
                batch, bs, zeros(batch, -(-width // bs)), zeros(batch), kernel.kernel,
                width, partitions_for(width),
            )  # fmt: skip
        return StepLayout(
            input_ids=zeros(1, batch),
            position_ids=zeros(1, batch),
            new_slots=zeros(batch),
            groups=groups,
            chunks=[],
            sample_rows=torch.arange(batch, device=self.device),
            samplers=[],
            device=self.device,
            decode_tables=tables,
        )

    def _fill(self, static: StepLayout, layout: StepLayout, width: int) -> None:
        """Copy the step's indices into the bucket's buffers; padding points at scratch."""
        size = layout.num_tokens
        static.input_ids.zero_()
        static.input_ids[:, :size].copy_(layout.input_ids)
        static.position_ids.zero_()
        static.position_ids[:, :size].copy_(layout.position_ids)
        static.new_slots.fill_(self.scratch_slot)
        static.new_slots[:size].copy_(layout.new_slots)
        tables = static.decode_tables
        if tables is not None:
            step = layout.decode_tables
            assert step is not None
            # Padding rows attend to their own key alone, in the scratch block.
            tables.context_lens.fill_(1)
            tables.block_tables.fill_(self.scratch_slot // tables.block_size)
            tables.context_lens[:size].copy_(step.context_lens)
            tables.block_tables[:size, : step.block_tables.shape[1]].copy_(step.block_tables)
            return
        group = static.groups[0]
        group.context_lens.fill_(1)
        table = group.slots.view(group.size, width)
        table.fill_(self.scratch_slot)
        for source in layout.groups:
            rows = slice(source.row_begin, source.row_end)
            group.context_lens[rows].copy_(source.context_lens)
            table[rows, : source.width].copy_(source.slots.view(source.size, source.width))
        static.masks_cache_clear()

    def _record(self, bucket: _Bucket) -> None:
        """Warm up on a side stream, then capture on that same stream (cuBLAS keeps its
        workspaces per stream: one first needed inside a capture fails it). On a
        failure the buckets not captured yet run eagerly: a failed capture can leave the
        graph pool recording, and each further capture would fail the same way."""
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.forward(bucket.layout)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            bucket.layout.masks_cache_clear()  # rebuild the masks inside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                bucket.logits = self.forward(bucket.layout)
            bucket.graph = graph
        except RuntimeError as error:  # e.g. a host sync inside the model's forward
            log.warning("decode CUDA graph capture failed (%s); decode runs eagerly", error)
            self.capture = False
