"""tokenfair's policies inside vLLM's own batch loop, as a `--scheduler-cls` plugin.

    python -m vllm.entrypoints.openai.api_server --model M \\
        --scheduler-cls tokenfair.integrations.vllm.FairScheduler \\
        --additional-config '{"tokenfair": {"policy": "vtc"}}'

On a GPU (async scheduling), use `FairAsyncScheduler` with `--async-scheduling`.
Requests name their tenant in `vllm_xargs` (OpenAI) or `SamplingParams.extra_args`
(offline): `{"tenant": "team-a"}`. Supported: vLLM 0.32.x and 0.33.x (importing this
package under another version raises ImportError saying so). See docs/vllm.md.
"""

from tokenfair.integrations.vllm.scheduler import (
    SUPPORTED_VLLM,
    FairAsyncScheduler,
    FairScheduler,
    FairSchedulerMixin,
)

__all__ = ["SUPPORTED_VLLM", "FairAsyncScheduler", "FairScheduler", "FairSchedulerMixin"]
