"""vLLM's real Scheduler driven by fabricated model outputs.

`make_scheduler` builds the scheduler the way vLLM's engine core does (a VllmConfig
from EngineArgs over a local model directory, a KV cache of `num_blocks` blocks), and
`step` plays the model runner: every scheduled request whose scheduled tokens reach
the end of its sequence gets one sampled token, as a real runner's step does.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable
from typing import Any

import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
TOKEN = 7  # every fabricated sample
_HAS_INDEX = "req_id_to_index" in getattr(ModelRunnerOutput, "__dataclass_fields__", {})


@functools.cache
def _config(
    model_dir: str,
    max_num_seqs: int,
    max_batched_tokens: int,
    prefix_caching: bool,
    scheduling_policy: str,
    cache_aware_window: int = 0,
) -> Any:
    # vLLM 0.34's --cache-aware-admission-window, only when asked (older minors lack it).
    window = {"cache_aware_admission_window": cache_aware_window} if cache_aware_window else {}
    args = EngineArgs(
        **window,
        model=model_dir,
        dtype="float32",
        enforce_eager=True,
        max_model_len=2048,
        block_size=BLOCK,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched_tokens,
        enable_prefix_caching=prefix_caching,
        scheduling_policy=scheduling_policy,
        skip_tokenizer_init=True,
    )
    return args.create_engine_config()


def make_scheduler(
    model_dir: str,
    cls: type[Scheduler] = Scheduler,
    *,
    num_blocks: int = 256,
    max_num_seqs: int = 4,
    max_batched_tokens: int = 2048,
    prefix_caching: bool = False,
    scheduling_policy: str = "fcfs",
    tokenfair: dict[str, Any] | None = None,
    cache_aware_window: int = 0,
) -> Any:
    # One engine config per shape (building one takes a second); each scheduler gets
    # a copy with its own tokenfair settings and KV pool size.
    config = copy.copy(
        _config(
            model_dir,
            max_num_seqs,
            max_batched_tokens,
            prefix_caching,
            scheduling_policy,
            cache_aware_window,
        )
    )
    config.additional_config = {"tokenfair": {"log_interval_s": 0, **(tokenfair or {})}}
    config.cache_config = copy.copy(config.cache_config)
    config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    scheduler = cls(config, kv, StructuredOutputManager(config), block_size=BLOCK)
    scheduler.test_block_hasher = None
    if prefix_caching:
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        scheduler.test_block_hasher = get_request_block_hasher(BLOCK, hash_fn)
    return scheduler


def make_request(
    scheduler: Any,
    request_id: str,
    tenant: str | None,
    prompt: int | list[int],
    max_tokens: int,
    *,
    arrival: float = 0.0,
    extra: dict[str, Any] | None = None,
) -> Request:
    ids = list(range(3, 3 + prompt)) if isinstance(prompt, int) else prompt
    extra_args = dict(extra or {})
    if tenant is not None:
        extra_args["tenant"] = tenant
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args or None)
    return Request(
        request_id,
        ids,
        params,
        None,
        arrival_time=arrival,
        block_hasher=scheduler.test_block_hasher,
    )


def add(scheduler: Any, requests: Iterable[Request]) -> list[Request]:
    added = list(requests)
    for request in added:
        scheduler.add_request(request)
    return added


def runner_output(scheduler: Any, output: Any) -> ModelRunnerOutput:
    """What a model runner returns for `output` (call it right after schedule()):
    one token for each request whose scheduled tokens reach its end."""
    ids = list(output.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = scheduler.requests[request_id]
        sampled.append([] if request.is_prefill_chunk else [TOKEN])
    # vLLM 0.34 indexes outputs by req_ids alone; before it, also by req_id_to_index.
    index = {"req_id_to_index": {rid: i for i, rid in enumerate(ids)}} if _HAS_INDEX else {}
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **index)


def step(scheduler: Any) -> Any:
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(scheduler, output))
    return output


def run(scheduler: Any, max_steps: int = 10_000) -> list[Any]:
    """Step until nothing is left; returns every step's SchedulerOutput."""
    outputs = []
    while scheduler.has_requests():
        outputs.append(step(scheduler))
        assert len(outputs) < max_steps, "the scheduler did not drain"
    return outputs


def new_ids(output: Any) -> list[str]:
    """Requests the step sent to the model runner in full: started for the first time,
    or (vLLM 0.34) resumed after a preemption."""
    return [new.req_id for new in output.scheduled_new_reqs]
