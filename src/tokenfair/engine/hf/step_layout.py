"""How one scheduler step becomes one packed forward pass.

Every scheduled request contributes its new tokens to a single packed sequence (batch
dimension 1). Requests that run a single token (decodes, and 1-token prefill chunks)
come first, so attention can treat them as one padded batch of single queries; longer
prefill chunks follow, each attended on its own. The layout holds, once per step, every
index and mask that the attention of every layer needs:

- `new_slots`: the pool slot of each packed token, where its K/V is written;
- for the single-query group, a padded `[B, max_context]` table of context slots and
  its validity mask;
- for each chunk, the slots of its whole context (cached prefix + new tokens);
- `sample_rows`: the packed row of the last token of every request that samples.

Nothing here runs the model; it only turns block tables into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenfair.core.batch import ScheduledRequest, SchedulerOutput


@dataclass(slots=True)
class Chunk:
    """A multi-token piece of one request: packed rows [q_begin, q_end)."""

    q_begin: int
    q_end: int
    start: int  # position of the first new token
    context_slots: torch.Tensor  # [start + n] slots of positions 0 .. start+n-1


@dataclass(slots=True)
class StepLayout:
    input_ids: torch.Tensor  # [1, Q]
    position_ids: torch.Tensor  # [1, Q]
    new_slots: torch.Tensor  # [Q]
    num_single: int  # packed rows [0, num_single) are single-query requests
    single_context_lens: torch.Tensor  # [B] context length (incl. the new token)
    single_slots: torch.Tensor  # [B * max_context] flattened padded context slots
    single_max_context: int
    chunks: list[Chunk]
    sample_rows: torch.Tensor  # [S] packed rows whose logits are sampled
    samplers: list[ScheduledRequest]  # the requests behind sample_rows, same order
    device: torch.device
    _masks: dict[int | None, tuple[torch.Tensor | None, list[torch.Tensor | None]]] = field(
        default_factory=dict
    )
    _packed_slots: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def masks(self, window: int | None) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
        """Boolean masks (True = attend) for the single-query group and for each chunk.

        `window` is the layer's sliding window (None for full attention): a query at
        position q sees keys k with q - window < k <= q, as in transformers. Built once
        per step and window, then shared by every layer. A chunk mask of None means plain
        causal attention over exactly its own tokens (SDPA's is_causal).
        """
        if window not in self._masks:
            self._masks[window] = (
                self._single_mask(window),
                [self._chunk_mask(c, window) for c in self.chunks],
            )
        return self._masks[window]

    def _single_mask(self, window: int | None) -> torch.Tensor | None:
        if self.num_single == 0:
            return None
        cols = torch.arange(self.single_max_context, device=self.device)
        lens = self.single_context_lens[:, None]
        mask = cols < lens
        if window is not None:
            mask &= cols > lens - 1 - window
        return mask[:, None, None, :]  # [B, 1 head, 1 query, max_context]

    def _chunk_mask(self, chunk: Chunk, window: int | None) -> torch.Tensor | None:
        n = chunk.q_end - chunk.q_begin
        context = chunk.start + n
        if chunk.start == 0 and (window is None or context <= window):
            return None
        q_pos = torch.arange(chunk.start, context, device=self.device)[:, None]
        k_pos = torch.arange(context, device=self.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        return mask

    def _packed_spans(self) -> list[tuple[int, int, torch.Tensor]]:
        """(q_begin, q_end, context slots) of every request, in packing order."""
        spans = []
        table = self.single_slots.view(self.num_single, -1) if self.num_single else None
        for row, length in enumerate(self.single_context_lens.tolist()):
            spans.append((row, row + 1, table[row, :length]))
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


def build_layout(batch: SchedulerOutput, device: torch.device) -> StepLayout:
    """Pack a scheduler step into tensors on `device`."""
    bs = batch.block_size
    singles = [s for s in batch.scheduled if s.num_new_tokens == 1]
    multis = [s for s in batch.scheduled if s.num_new_tokens > 1]

    token_ids: list[int] = []
    positions: list[int] = []
    new_slots: list[int] = []
    samplers: list[ScheduledRequest] = []
    sample_rows: list[int] = []

    context_lens: list[int] = []
    tables: list[list[int]] = []
    for s in singles:
        all_ids = s.request.all_token_ids()
        pos = s.start
        token_ids.append(all_ids[pos])
        positions.append(pos)
        new_slots.append(s.block_ids[pos // bs] * bs + pos % bs)
        context_lens.append(pos + 1)
        tables.append(s.block_ids[: pos // bs + 1])
        if s.samples:
            sample_rows.append(len(token_ids) - 1)
            samplers.append(s)

    single_max = max(context_lens, default=0)
    if singles:
        width = -(-single_max // bs)
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
        cols = torch.arange(single_max)
        single_slots = (padded[:, cols // bs] * bs + cols % bs).flatten()
    else:
        single_slots = torch.empty(0, dtype=torch.long)

    chunks: list[Chunk] = []
    for s in multis:
        all_ids = s.request.all_token_ids()
        end = s.start + s.num_new_tokens
        context = _context_slots(s.block_ids, end, bs)
        q_begin = len(token_ids)
        token_ids.extend(all_ids[s.start : end])
        positions.extend(range(s.start, end))
        new_slots.extend(context[s.start :].tolist())
        chunks.append(Chunk(q_begin, len(token_ids), s.start, context.to(device)))
        if s.samples:
            sample_rows.append(len(token_ids) - 1)
            samplers.append(s)

    def on_device(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(device)

    return StepLayout(
        input_ids=on_device(token_ids)[None],
        position_ids=on_device(positions)[None],
        new_slots=on_device(new_slots),
        num_single=len(singles),
        single_context_lens=on_device(context_lens),
        single_slots=single_slots.to(device),
        single_max_context=single_max,
        chunks=chunks,
        sample_rows=on_device(sample_rows),
        samplers=samplers,
        device=device,
    )


def step_shape(batch: SchedulerOutput) -> tuple[int, int, int]:
    """(prefill tokens, decode requests, context tokens) of a step, counted exactly as
    the simulator's SimExecutor counts them, so a fitted profile means the same there."""
    prefill = decode = context = 0
    for s in batch.scheduled:
        if s.num_new_tokens == 1 and s.start >= s.request.input_tokens:
            decode += 1
            context += s.start + 1
        else:
            prefill += s.num_new_tokens
    return prefill, decode, context
