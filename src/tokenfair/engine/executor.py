"""The seam between the engine and whatever runs the model.

A simulator executor models step time from a profile; a real executor runs a
transformers model on CPU or CUDA. Both take a SchedulerOutput and return the sampled
tokens; neither decides who runs.
"""

from __future__ import annotations

from typing import Protocol

from tokenfair.core.batch import ExecutorOutput, SchedulerOutput


class Executor(Protocol):
    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        """Run one step: swap copies, then one forward pass over `batch.scheduled`."""
        ...


class Detokenizer(Protocol):
    """Turns a request's generated tokens into text incrementally (for stop strings)."""

    def new_text(self, request_id: str, output_token_ids: list[int]) -> str:
        """Text added by the latest token(s) of this request."""
        ...

    def forget(self, request_id: str) -> None: ...
