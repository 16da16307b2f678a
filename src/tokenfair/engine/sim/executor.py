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

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        sampled: dict[str, int] = {}
        for s in batch.scheduled:
            request = s.request
            outputs = len(request.output_token_ids)
            if s.start + s.num_new_tokens == request.input_tokens + outputs:
                target = request.target_output_tokens
                done = target is not None and outputs + 1 >= target
                sampled[request.request_id] = SIM_EOS if done else SIM_TOKEN
        elapsed = 0.0
        if batch.scheduled:
            elapsed = self.profile.step_time(*batch.step_shape())
        copied = len(batch.swap_out) + len(batch.swap_in)
        if copied:
            elapsed += copied * batch.block_size * self.profile.swap_token_s
        return ExecutorOutput(sampled=sampled, elapsed_s=elapsed)
