"""HFExecutor: runs scheduler steps on a transformers causal LM with our paged KV pool.

Each step: swap copies, then ONE forward pass over every scheduled token (prefill chunks
and decodes packed together as a single sequence with explicit positions), logits only
at the last token of each request that samples, then per-request sampling. The model
is a stock transformers model; `PagedKVCache` and the registered `paged_attention`
function route its keys and values through our pool (see those modules).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import torch

from tokenfair.core.batch import ExecutorOutput, SchedulerOutput
from tokenfair.engine.hf import triton_decode
from tokenfair.engine.hf.attention import ATTENTION_NAME, LAYOUT_KWARG
from tokenfair.engine.hf.cpu_kernels import paged_decode_kernel
from tokenfair.engine.hf.cpu_linear import pack_linear_layers
from tokenfair.engine.hf.cpu_row_ops import engine_step, fuse_row_ops
from tokenfair.engine.hf.cpu_runtime import SPIN_COUNT, keep_freed_memory, policy_came_too_late
from tokenfair.engine.hf.decode_graphs import StaticDecode
from tokenfair.engine.hf.fused_projections import fuse_projections as fuse_projections_of
from tokenfair.engine.hf.kv_pool import KVPool, KVShape, describe_kv_budget
from tokenfair.engine.hf.paged_cache import PagedKVCache
from tokenfair.engine.hf.sampler import Sampler
from tokenfair.engine.hf.step_layout import DecodeKernel, StepLayout, build_layout

log = logging.getLogger(__name__)

AttentionMode = Literal["paged", "masked"]

# A prepared 4D mask is passed through by transformers' mask builders untouched; in
# paged mode attention ignores it, so an empty one just stops them from building a mask.
_NO_MASK_SHAPE = (1, 1, 0, 0)


def uniform_sliding_window(config) -> int | None:
    """The sliding window every layer uses, or None for full attention everywhere.

    Masked mode builds one mask for all layers, so it cannot serve models that mix
    full and sliding layers; paged mode can (it reads each layer's window).
    """
    config = config.get_text_config()
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    types = set(getattr(config, "layer_types", None) or ["sliding_attention"])
    if types == {"sliding_attention"}:
        return window
    if "sliding_attention" not in types:
        return None
    raise ValueError(
        "attention='masked' cannot serve a model mixing full and sliding-window layers; use 'paged'"
    )


class HFExecutor:
    """Executor over a transformers causal LM.

    `attention="paged"` (default) attends per request through `paged_attention`;
    `"masked"` keeps the model's own attention implementation and feeds it one packed
    context per step with a block-diagonal causal mask (simpler, slower on big batches).
    """

    def __init__(
        self,
        model: Any,  # a transformers PreTrainedModel (causal LM)
        num_blocks: int,
        block_size: int = 16,
        num_swap_blocks: int = 0,
        attention: AttentionMode = "paged",
        seed: int = 0,
        static_decode: bool | None = None,
        decode_kernel: bool | DecodeKernel | None = None,
        pack_linear: bool | None = None,
        fuse_projections: bool = True,
    ) -> None:
        if attention not in ("paged", "masked"):
            raise ValueError(f"attention must be 'paged' or 'masked', got {attention!r}")
        self.model = model.eval()
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":
            keep_freed_memory()
            if policy_came_too_late():
                log.warning(
                    "torch was imported before tokenfair.engine.hf, so OpenMP threads spin "
                    "long when idle (slow on a busy machine); set GOMP_SPINCOUNT=%d in the "
                    "environment",
                    SPIN_COUNT,
                )
        self.dtype = next(model.parameters()).dtype
        # Float32 CPU models: linear layers on prepacked oneDNN weights (cpu_linear);
        # None packs wherever that applies, False keeps torch's BLAS path.
        # QKV and gate-up as one matrix each (before packing: the stacked layers pack too).
        self.fused_projection_groups = fuse_projections_of(model) if fuse_projections else 0
        self.packed_linear_layers = self.row_kernel_layers = 0
        if self.device.type == "cpu" and self.dtype == torch.float32:
            if pack_linear is not False:
                self.packed_linear_layers = pack_linear_layers(model)
            # RMS norms, SiLU-gated MLPs and rotary embeddings in one pass each (cpu_row_ops).
            self.row_kernel_layers = fuse_row_ops(model)
        self.kv_shape = KVShape.from_config(model.config, self.dtype)
        # Static decode (CUDA graphs on a GPU; default there) needs paged attention and
        # one scratch block past the scheduler's blocks for its padding rows.
        if static_decode is None:
            static_decode = self.device.type == "cuda"
        static_decode = static_decode and attention == "paged"
        pool_blocks = num_blocks + 1 if static_decode else num_blocks
        self.pool = KVPool(self.kv_shape, pool_blocks, block_size, self.device, num_swap_blocks)
        self.static_decode = (
            StaticDecode(self._logits, num_blocks * block_size, self.device, capture=True)
            if static_decode
            else None
        )
        self.attention: AttentionMode = attention
        self.decode_kernel = choose_decode_kernel(
            decode_kernel, self.device, self.dtype, attention, block_size, self.static_decode
        )
        self.cache = PagedKVCache(self.pool, packed=attention == "masked")
        if attention == "paged":
            model.set_attn_implementation(ATTENTION_NAME)
            self._window = None  # paged attention reads each layer's own window
        else:
            self._window = uniform_sliding_window(model.config)
        self.sampler = Sampler(seed, self.device)
        self._no_mask = torch.zeros(_NO_MASK_SHAPE, dtype=self.dtype, device=self.device)
        # Time spent inside the model's forward call, for overhead measurements.
        self.forward_s_total = 0.0
        self.last_forward_s = 0.0
        self.last_shape = (0, 0, 0)  # (prefill tokens, decode requests, context tokens)
        log.info(describe_kv_budget(self.kv_shape, num_blocks, block_size))

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def vocab_size(self) -> int:
        return self.model.config.get_text_config().vocab_size

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        began = time.perf_counter()
        if batch.block_size != self.pool.block_size:
            raise ValueError(
                f"scheduler block_size {batch.block_size} != executor block_size {self.pool.block_size}"
            )
        self.pool.swap_out(batch.swap_out)
        self.pool.swap_in(batch.swap_in)
        output = ExecutorOutput()
        self.last_shape = batch.step_shape()
        if batch.scheduled:
            layout = build_layout(batch, self.device, self.decode_kernel)
            logits = self.forward(layout)
            requests = [s.request for s in layout.samplers]
            tokens, output.logprobs = self.sampler.sample(logits, requests)
            output.sampled = {r.request_id: t for r, t in zip(requests, tokens, strict=True)}
        output.elapsed_s = time.perf_counter() - began
        return output

    @torch.inference_mode()
    def forward(self, layout: StepLayout) -> torch.Tensor:
        """Run the packed step; returns float32 logits [samplers, vocab].

        No host synchronisation here: on a GPU the forward is only queued, and the
        sampler's read of the chosen tokens is the step's one sync (so on CUDA
        `last_forward_s` is the time to queue it).
        """
        began = time.perf_counter()
        if self.static_decode is not None and self.static_decode.accepts(layout):
            logits = self.static_decode.run(layout).float()
        else:
            logits = self._logits(layout).float()
        self.last_forward_s = time.perf_counter() - began
        self.forward_s_total += self.last_forward_s
        return logits

    def _logits(self, layout: StepLayout) -> torch.Tensor:
        """The model's logits at `layout.sample_rows`, in the model's dtype."""
        self.cache.layout = layout
        extra: dict[str, object] = {}
        if self.attention == "paged":
            mask = self._no_mask
            extra[LAYOUT_KWARG] = layout
        else:
            mask = layout.packed_mask(self.dtype, self._window)
        try:
            with engine_step():
                out = self.model(
                    input_ids=layout.input_ids,
                    position_ids=layout.position_ids,
                    attention_mask=mask,
                    cache=self.cache,
                    use_cache=True,
                    logits_to_keep=layout.sample_rows,
                    **extra,
                )
        finally:
            self.cache.layout = None
        return out.logits[0]


def choose_decode_kernel(
    requested: bool | DecodeKernel | None,
    device: torch.device,
    dtype: torch.dtype,
    attention: str,
    block_size: int,
    static_decode: StaticDecode | None,
) -> DecodeKernel | None:
    """Which kernel reads the decodes' contexts in place from the pool, if any.

    Left to us (None): the C kernel on float32 CPU models where it builds; on a GPU the
    torch path (gathers and SDPA), until the prepared GPU script has measured the
    Triton kernel there (docs/engine.md). True: the device's kernel, or an error;
    "c" or "triton": that one, or an error; False: none.
    """
    if requested is False:
        return None
    if attention != "paged" and requested:
        raise ValueError("an in-place decode kernel needs paged attention")
    on_cpu = device.type == "cpu"
    if requested == "triton" or (requested is True and not on_cpu):
        if not triton_decode.available():
            raise RuntimeError(
                "the Triton decode kernel needs Triton (PyTorch's CUDA builds ship it)"
            )
        if on_cpu and not triton_decode.interpreted():
            raise ValueError("the Triton decode kernel runs on a GPU (on the CPU only in tests)")
        triton_decode.check_block_size(block_size)
        return "triton"
    c_applies = attention == "paged" and on_cpu and dtype == torch.float32 and static_decode is None
    if requested:  # "c", or True on the CPU
        if not c_applies:
            raise ValueError("decode_kernel needs paged attention on a float32 CPU model")
        if paged_decode_kernel() is None:
            raise RuntimeError("the CPU attention kernel is not available (the log says why)")
        return "c"
    return "c" if c_applies and paged_decode_kernel() is not None else None
