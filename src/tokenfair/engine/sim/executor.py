"""An executor that runs no model: it times each step with a profile and emits a
placeholder token for each request that samples. The scheduler ends each request at
its trace output length (`Request.target_output_tokens`)."""

from __future__ import annotations

from tokenfair.core.batch import ExecutorOutput, SchedulerOutput
from tokenfair.engine.sim.profile import StepTimeProfile

SIM_TOKEN = 1
SIM_EOS = 0  # never emitted here; tests' fake executors use it as an explicit EOS
SIM_EOS_IDS = frozenset({SIM_EOS})


class SimExecutor:
    def __init__(self, profile: StepTimeProfile):
        self.profile = profile

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        sampled = {s.request.request_id: SIM_TOKEN for s in batch.scheduled if s.samples}
        elapsed = 0.0
        if batch.scheduled:
            elapsed = self.profile.step_time(*batch.step_shape())
        copied = len(batch.swap_out) + len(batch.swap_in)
        if copied:
            elapsed += copied * batch.block_size * self.profile.swap_token_s
        return ExecutorOutput(sampled=sampled, elapsed_s=elapsed)
