"""tokenfair's policies inside vLLM's own batch loop, as a `--scheduler-cls` plugin.

    vllm serve MODEL \\
        --scheduler-cls tokenfair.integrations.vllm.FairScheduler \\
        --additional-config '{"tokenfair": {"policy": "vtc"}}'

On a GPU (async scheduling), use `FairAsyncScheduler` with `--async-scheduling`.
Requests name their tenant in `vllm_xargs` (OpenAI) or `SamplingParams.extra_args`
(offline): `{"tenant": "team-a"}`. Tested with vLLM 0.32, 0.33 and 0.34; importing
this package checks that vLLM's scheduler has what the plugin uses (ImportError, in one
line, naming what is missing), and a newer minor that has it runs with one warning.
See docs/vllm.md.
"""

from tokenfair.integrations.vllm.scheduler import (
    FairAsyncScheduler,
    FairScheduler,
    FairSchedulerMixin,
)
from tokenfair.integrations.vllm.surface import TESTED_VLLM

__all__ = ["TESTED_VLLM", "FairAsyncScheduler", "FairScheduler", "FairSchedulerMixin"]
