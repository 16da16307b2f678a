"""An executor that runs no model: it times each step with a profile and emits a
placeholder token for each request that samples. The scheduler ends each request at
its trace output length (`Request.target_output_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenfair.core.batch import ExecutorOutput, SchedulerOutput
from tokenfair.engine.clock import Clock
from tokenfair.engine.sim.profile import StepTimeProfile

SIM_TOKEN = 1
SIM_EOS = 0  # never emitted here; tests' fake executors use it as an explicit EOS
SIM_EOS_IDS = frozenset({SIM_EOS})


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One simulated step: when it ran and its shape (for calibration)."""

    start_s: float
    end_s: float
    prefill_tokens: int
    decode_requests: int
    context_tokens: int


class SimExecutor:
    def __init__(
        self,
        profile: StepTimeProfile,
        step_log: list[StepRecord] | None = None,
        clock: Clock | None = None,
    ):
        """`step_log`, with the engine's `clock`, receives a record of every step."""
        if step_log is not None and clock is None:
            raise ValueError("a step log needs the engine's clock")
        self.profile = profile
        self.step_log = step_log
        self.clock = clock

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        sampled = {s.request.request_id: SIM_TOKEN for s in batch.scheduled if s.samples}
        elapsed = 0.0
        shape = batch.step_shape() if batch.scheduled else (0, 0, 0)
        if batch.scheduled:
            elapsed = self.profile.step_time(*shape)
        copied = len(batch.swap_out) + len(batch.swap_in)
        if copied:
            elapsed += copied * batch.block_size * self.profile.swap_token_s
        if self.step_log is not None:
            start = self.clock.now()  # type: ignore[union-attr]
            self.step_log.append(StepRecord(start, start + elapsed, *shape))
        return ExecutorOutput(sampled=sampled, elapsed_s=elapsed)
