"""How one scheduler step becomes one packed forward pass.

Every scheduled request contributes its new tokens to a single packed sequence (batch
dimension 1). Requests that run a single token (decodes, and 1-token prefill chunks)
come first, longest context first, split into a few *decode groups* of similar context
length; attention runs each group as one padded batch of single queries. Padding every
decode to the longest context in the step would waste up to half the gather and
attention work when lengths are mixed; groups bound the waste (each group's shortest
context is at least 1/GROUP_SPREAD of its longest) at the price of one more attention
call per group. Longer prefill chunks follow, each attended on its own.

The layout holds, once per step, every index and mask that every layer's attention
needs:

- `new_slots`: the pool slot of each packed token, where its K/V is written;
- the decodes' block tables and context lengths, where a kernel reads the pool in
  place (`DecodeTables`, see cpu_kernels), or else per decode group a padded
  `[B, width]` table of context slots and its validity mask;
- per chunk, the slots of its whole context (cached prefix + new tokens);
- `sample_rows`: the packed row of the last token of every request that samples.

Nothing here runs the model; it only turns block tables into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.nn.attention.bias import causal_lower_right

from tokenfair.core.batch import ScheduledRequest, SchedulerOutput
from tokenfair.core.request import Request
from tokenfair.engine.hf.triton_decode import partitions_for

GROUP_SPREAD = 1.5  # a decode group's longest context / its shortest, at most
MAX_GROUPS = 4  # beyond this, the last group takes every shorter context


@dataclass(slots=True)
class DecodeGroup:
    """Single-query requests at packed rows [row_begin, row_end), contexts padded to `width`."""

    row_begin: int
    row_end: int
    width: int
    context_lens: torch.Tensor  # [B] context length, including the new token
    slots: torch.Tensor  # [B * width] padded context slots, row-major

    @property
    def size(self) -> int:
        return self.row_end - self.row_begin


# The kernels that read decodes in place from the pool: the C one on the CPU
# (cpu_kernels), the Triton one on a GPU (triton_decode).
DecodeKernel = Literal["c", "triton"]


@dataclass(slots=True)
class DecodeTables:
    """Every single-query request at packed rows [0, size), for an in-place kernel."""

    size: int
    block_size: int
    block_tables: torch.Tensor  # [B, max blocks] each request's blocks, zero-padded
    context_lens: torch.Tensor  # [B] context length, including the new token
    kernel: DecodeKernel = "c"
    longest: int = 0  # the longest context, known on the host
    # Context partitions of the Triton kernel: enough for the longest context, fixed
    # per static bucket (triton_decode.partitions_for).
    partitions: int = 1


@dataclass(slots=True)
class Chunk:
    """A multi-token piece of one request: packed rows [q_begin, q_end)."""

    q_begin: int
    q_end: int
    start: int  # position of the first new token
    context_slots: torch.Tensor  # [start + n] slots of positions 0 .. start+n-1


Masks = tuple[list[torch.Tensor], list[torch.Tensor | None]]


@dataclass(slots=True)
class StepLayout:
    input_ids: torch.Tensor  # [1, Q]
    position_ids: torch.Tensor  # [1, Q]
    new_slots: torch.Tensor  # [Q]
    groups: list[DecodeGroup]
    chunks: list[Chunk]
    sample_rows: torch.Tensor  # [S] packed rows whose logits are sampled
    samplers: list[ScheduledRequest]  # the requests behind sample_rows, same order
    device: torch.device
    decode_tables: DecodeTables | None = None  # set instead of `groups` for the kernel
    _masks: dict[int | None, Masks] = field(default_factory=dict)
    _packed_slots: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def masks(self, window: int | None) -> Masks:
        """Boolean masks (True = attend) for each decode group and each chunk.

        `window` is the layer's sliding window (None for full attention): a query at
        position q sees keys k with q - window < k <= q, as in transformers. Built once
        per step and window, then shared by every layer. A chunk mask of None means plain
        causal attention over exactly its own tokens (SDPA's is_causal); a chunk after a
        cached prefix, with no window reached, gets torch's lower-right causal bias
        rather than a tensor, so SDPA keeps to its fused kernels.
        """
        if window not in self._masks:
            self._masks[window] = (
                [self._group_mask(g, window) for g in self.groups],
                [self._chunk_mask(c, window) for c in self.chunks],
            )
        return self._masks[window]

    def masks_cache_clear(self) -> None:
        """Forget built masks (static decode refills the same layout's tensors each step)."""
        self._masks.clear()

    def _group_mask(self, group: DecodeGroup, window: int | None) -> torch.Tensor:
        cols = torch.arange(group.width, device=self.device)
        lens = group.context_lens[:, None]
        mask = cols < lens
        if window is not None:
            mask &= cols > lens - 1 - window
        return mask[:, None, None, :]  # [B, 1 head, 1 query, width]

    def _chunk_mask(self, chunk: Chunk, window: int | None) -> torch.Tensor | None:
        n = chunk.q_end - chunk.q_begin
        context = chunk.start + n
        if window is None or context <= window:  # causal, no window reached
            if chunk.start == 0:
                return None
            # After a cached prefix: causal aligned to the last key, which SDPA runs on
            # its fused kernels where an explicit mask would keep it on the plain one.
            return causal_lower_right(n, context)
        q_pos = torch.arange(chunk.start, context, device=self.device)[:, None]
        k_pos = torch.arange(context, device=self.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        return mask

    def _packed_spans(self) -> list[tuple[int, int, torch.Tensor]]:
        """(q_begin, q_end, context slots) of every request, in packing order."""
        spans = []
        for group in self.groups:
            table = group.slots.view(group.size, group.width)
            for i, length in enumerate(group.context_lens.tolist()):
                row = group.row_begin + i
                spans.append((row, row + 1, table[i, :length]))
        spans.extend((c.q_begin, c.q_end, c.context_slots) for c in self.chunks)
        return spans

    def packed_slots(self) -> torch.Tensor:
        """Slots of every request's whole context, concatenated in packing order."""
        if self._packed_slots is None:
            self._packed_slots = torch.cat([slots for _, _, slots in self._packed_spans()])
        return self._packed_slots

    def packed_mask(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """The block-diagonal causal mask `[1, 1, Q, K]` over `packed_slots()`, additive in
        `dtype` (0 or its most negative value): each request's tokens see only their own
        context (within `window` for sliding-window models). Any stock attention
        implementation (eager, sdpa) understands this form."""
        spans = self._packed_spans()
        total_keys = sum(slots.numel() for _, _, slots in spans)
        allowed = torch.zeros(self.num_tokens, total_keys, dtype=torch.bool, device=self.device)
        k_begin = 0
        for q_begin, q_end, slots in spans:
            length, n = slots.numel(), q_end - q_begin
            q_pos = torch.arange(length - n, length, device=self.device)[:, None]
            k_pos = torch.arange(length, device=self.device)[None, :]
            visible = k_pos <= q_pos
            if window is not None:
                visible &= k_pos > q_pos - window
            allowed[q_begin:q_end, k_begin : k_begin + length] = visible
            k_begin += length
        bias = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        bias.masked_fill_(~allowed, torch.finfo(dtype).min)
        return bias[None, None]


def _context_slots(block_ids: list[int], length: int, block_size: int) -> torch.Tensor:
    """Slots of positions 0 .. length-1 for a block table."""
    num_blocks = -(-length // block_size)
    blocks = torch.tensor(block_ids[:num_blocks], dtype=torch.long)
    slots = blocks[:, None] * block_size + torch.arange(block_size)
    return slots.flatten()[:length]


def _split_groups(lens: list[int]) -> list[tuple[int, int]]:
    """[begin, end) ranges over `lens` (sorted longest first) forming the decode groups."""
    ranges: list[tuple[int, int]] = []
    begin = 0
    for i, length in enumerate(lens):
        if length * GROUP_SPREAD < lens[begin] and len(ranges) < MAX_GROUPS - 1:
            ranges.append((begin, i))
            begin = i
    if lens:
        ranges.append((begin, len(lens)))
    return ranges


def _decode_group_tables(
    lens: list[int], tables: list[list[int]], block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(context lengths [B], padded context slots [B * width]) of one decode group, on CPU."""
    width = lens[0]  # longest first
    blocks = -(-width // block_size)
    padded = torch.tensor([t + [0] * (blocks - len(t)) for t in tables], dtype=torch.long)
    cols = torch.arange(width)
    slots = (padded[:, cols // block_size] * block_size + cols % block_size).flatten()
    return torch.tensor(lens, dtype=torch.long), slots


def _token_at(request: Request, position: int) -> int:
    """The request's token at `position` without concatenating prompt and output."""
    prompt = request.prompt_token_ids
    if prompt is None:
        raise ValueError(f"request {request.request_id} has no prompt token ids")
    if position < len(prompt):
        return prompt[position]
    return request.output_token_ids[position - len(prompt)]


def _ship(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The step's index tensors on `device` in ONE host-to-device copy.

    On CPU they are returned as they are. On CUDA they travel as one pinned buffer,
    copied without blocking the host (the caching host allocator keeps the buffer alive
    until the copy is done), then split into views: one transfer per step instead of one
    per tensor, and no synchronisation before the forward pass is queued.
    """
    if device.type == "cpu":
        return tensors
    flat = torch.cat([t.flatten() for t in tensors])
    if device.type == "cuda":
        flat = flat.pin_memory()
    flat = flat.to(device, non_blocking=True)
    sizes = [t.numel() for t in tensors]
    return [part.view(t.shape) for part, t in zip(flat.split(sizes), tensors, strict=True)]


def _decode_tables(
    lens: list[int], tables: list[list[int]], block_size: int, kernel: DecodeKernel
) -> DecodeTables:
    """Block tables padded to the longest (lens sorted longest first), on CPU."""
    blocks = len(tables[0])
    padded = torch.tensor([t + [0] * (blocks - len(t)) for t in tables], dtype=torch.long)
    lens_tensor = torch.tensor(lens, dtype=torch.long)
    longest = lens[0]
    return DecodeTables(
        len(lens), block_size, padded, lens_tensor, kernel, longest, partitions_for(longest)
    )


def build_layout(
    batch: SchedulerOutput, device: torch.device, decode_kernel: DecodeKernel | None = None
) -> StepLayout:
    """Pack a scheduler step into tensors on `device`.

    `decode_kernel`: describe the decodes by block tables for that kernel, which reads
    the pool in place, instead of decode groups of gathered slots.
    """
    bs = batch.block_size
    singles = sorted((s for s in batch.scheduled if s.num_new_tokens == 1), key=lambda s: -s.start)
    multis = [s for s in batch.scheduled if s.num_new_tokens > 1]

    token_ids: list[int] = []
    positions: list[int] = []
    new_slots: list[int] = []
    samplers: list[ScheduledRequest] = []
    sample_rows: list[int] = []

    context_lens: list[int] = []
    tables: list[list[int]] = []
    for s in singles:
        pos = s.start
        token_ids.append(_token_at(s.request, pos))
        positions.append(pos)
        new_slots.append(s.block_ids[pos // bs] * bs + pos % bs)
        context_lens.append(pos + 1)
        tables.append(s.block_ids[: pos // bs + 1])
        if s.samples:
            sample_rows.append(len(token_ids) - 1)
            samplers.append(s)
    tables_for_kernel = None
    if decode_kernel is not None and context_lens:
        tables_for_kernel = _decode_tables(context_lens, tables, bs, decode_kernel)
    group_ranges = [] if tables_for_kernel is not None else _split_groups(context_lens)
    group_tensors = [
        _decode_group_tables(context_lens[begin:end], tables[begin:end], bs)
        for begin, end in group_ranges
    ]

    chunk_spans: list[tuple[int, int, int]] = []
    chunk_slots: list[torch.Tensor] = []
    for s in multis:
        all_ids = s.request.all_token_ids()
        assert all_ids is not None, "the engine serves requests with prompt token ids"
        end = s.start + s.num_new_tokens
        context = _context_slots(s.block_ids, end, bs)
        q_begin = len(token_ids)
        token_ids.extend(all_ids[s.start : end])
        positions.extend(range(s.start, end))
        new_slots.extend(context[s.start :].tolist())
        chunk_spans.append((q_begin, len(token_ids), s.start))
        chunk_slots.append(context)
        if s.samples:
            sample_rows.append(len(token_ids) - 1)
            samplers.append(s)

    flat = [
        torch.tensor(v, dtype=torch.long) for v in (token_ids, positions, new_slots, sample_rows)
    ]
    flat += [t for pair in group_tensors for t in pair] + chunk_slots
    if tables_for_kernel is not None:
        flat += [tables_for_kernel.block_tables, tables_for_kernel.context_lens]
    shipped = iter(_ship(flat, device))
    input_ids, position_ids, slots, rows = (next(shipped) for _ in range(4))
    groups = [
        DecodeGroup(begin, end, context_lens[begin], next(shipped), next(shipped))
        for begin, end in group_ranges
    ]
    chunks = [Chunk(q_begin, q_end, start, next(shipped)) for q_begin, q_end, start in chunk_spans]
    if tables_for_kernel is not None:
        tables_for_kernel.block_tables = next(shipped)
        tables_for_kernel.context_lens = next(shipped)
    return StepLayout(
        input_ids=input_ids[None],
        position_ids=position_ids[None],
        new_slots=slots,
        groups=groups,
        chunks=chunks,
        sample_rows=rows,
        samplers=samplers,
        device=device,
        decode_tables=tables_for_kernel,
    )
