"""An executor that runs no model: it times each step with a profile and emits
placeholder tokens, ending each request with EOS at its trace output length."""

from __future__ import annotations

from tokenfair.core.batch import ExecutorOutput, SchedulerOutput
from tokenfair.engine.sim.profile import StepTimeProfile

SIM_TOKEN = 1
SIM_EOS = 0
SIM_EOS_IDS = frozenset({SIM_EOS})


class SimExecutor:
    def __init__(self, profile: StepTimeProfile):
        self.profile = profile
        self.busy_s = 0.0

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        prefill_tokens = decode_requests = context_tokens = 0
        sampled: dict[str, int] = {}
        for s in batch.scheduled:
            request = s.request
            n = s.num_new_tokens
            if n == 1 and s.start >= request.input_tokens:
                decode_requests += 1
                context_tokens += s.start + 1
            else:
                prefill_tokens += n
            if s.start + n == request.input_tokens + len(request.output_token_ids):
                target = request.target_output_tokens
                done = target is not None and len(request.output_token_ids) + 1 >= target
                sampled[request.request_id] = SIM_EOS if done else SIM_TOKEN
        elapsed = 0.0
        if batch.scheduled:
            elapsed = self.profile.step_time(prefill_tokens, decode_requests, context_tokens)
        copied = len(batch.swap_out) + len(batch.swap_in)
        if copied:
            elapsed += copied * batch.block_size * self.profile.swap_token_s
        self.busy_s += elapsed
        return ExecutorOutput(sampled=sampled, elapsed_s=elapsed)
