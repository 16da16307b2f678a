"""The engine step loop: scheduler -> executor -> apply outputs -> per-request outputs.

The same loop serves real models on the wall clock and replays traces on a virtual
clock; only the executor and the clock differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tokenfair.core.request import FinishReason, Request
from tokenfair.core.scheduler import Scheduler
from tokenfair.core.share_tree import ShareTree
from tokenfair.engine.clock import Clock, WallClock
from tokenfair.engine.executor import Detokenizer, Executor
from tokenfair.engine.stats import EngineStats


@dataclass(slots=True)
class RequestOutput:
    """What one step added to one request."""

    request: Request
    new_token_ids: list[int]
    new_text: str = ""
    finished: bool = False
    # Per new token, {token id: logprob} (the sampled one and the top alternatives),
    # when the request asked for logprobs and the executor provides them.
    logprobs: list[dict[int, float]] | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.request.finish_reason


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        clock: Clock | None = None,
        detokenizer: Detokenizer | None = None,
    ):
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock or WallClock()
        self.detokenizer = detokenizer
        self.num_steps = 0
        self.busy_s = 0.0  # time spent in steps (the rest is idle)
        self._aborted: list[Request] = []

    def stats(self) -> EngineStats:
        """What it holds and has done, now (on its own thread, between two steps)."""
        return EngineStats.of(self.scheduler, self.num_steps, self.busy_s)

    def policy_status(self) -> dict[str, object]:
        """Its policy's name and whether it failed (a served policy: policy_guard.py)."""
        policy = self.scheduler.policy
        status = getattr(policy, "status", None)
        return status() if callable(status) else {"name": policy.name, "failed": False}

    def reweigh(self, weights: Mapping[str, float], tree: ShareTree | None = None) -> None:
        """New weights for its policy (tenants, and groups as `@path`) and, after a
        tenants file is reloaded, the tree; the next step's decisions use them."""
        self.scheduler.policy.reweigh(weights, tree)

    def add_request(self, request: Request) -> bool:
        """Queue a request; False if the policy or the pool refused it (finished REJECTED)."""
        return self.scheduler.add_request(request, self.clock.now())

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> bool:
        """Cancel a request (unknown ids: False); its slot and KV blocks are free before
        the next step. `reason` labels its end (a timeout is reported as such)."""
        request = self.scheduler.requests.get(request_id)
        if request is None or not self.scheduler.abort(request_id, self.clock.now(), reason):
            return False
        if self.detokenizer is not None:
            self.detokenizer.forget(request_id)
        self._aborted.append(request)
        return True

    def aborted_outputs(self) -> list[RequestOutput]:
        """The last outputs of the requests aborted since the previous step (each once;
        `step` hands them out too)."""
        outputs = [RequestOutput(r, [], finished=True) for r in self._aborted]
        self._aborted = []
        return outputs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, emit: bool = True) -> list[RequestOutput]:
        """Run one step; return an output for each request that gained tokens or ended.

        `emit=False` skips building outputs (the simulator reads requests directly).
        """
        scheduler = self.scheduler
        start = self.clock.now()
        batch = scheduler.schedule(start)
        outputs = self.aborted_outputs()
        if batch.is_empty:
            return outputs
        result = self.executor.execute(batch)
        if result.elapsed_s is not None:
            self.clock.advance(result.elapsed_s)
        end = self.clock.now()
        self.busy_s += end - start
        self.num_steps += 1
        produced = scheduler.update(batch, result, end)
        if not emit:
            return outputs
        logprobs = result.logprobs or {}
        for request in produced:
            output = RequestOutput(
                request,
                request.output_token_ids[-1:],
                finished=request.is_finished,
                logprobs=logprobs.get(request.request_id),
            )
            if self.detokenizer is not None:
                self._detokenize(output, end)
            outputs.append(output)
        return outputs

    def _detokenize(self, output: RequestOutput, now: float) -> None:
        """Add the new text; end the request at a stop string, which is never returned.

        While a request runs, the last len(longest stop) - 1 characters are held back
        from the stream: they may turn out to be the start of a stop string. They are
        released when more text rules that out, or when the request finishes.
        """
        request = output.request
        detokenizer = self.detokenizer
        assert detokenizer is not None
        before = len(request.output_text)
        request.output_text += detokenizer.new_text(request.request_id, request.output_token_ids)
        stops = request.sampling.stop
        held_back = 0
        if stops:
            longest = max(map(len, stops))
            # A match not found before must end in the new text, so it starts here at the
            # earliest; among all stops, the earliest match wins.
            search_from = max(0, before - longest + 1)
            found = [
                at
                for at in (request.output_text.find(stop, search_from) for stop in stops)
                if at >= 0
            ]
            if found:
                request.output_text = request.output_text[: min(found)]
                if request.is_finished:
                    request.finish_reason = FinishReason.STOP  # stop string and EOS/length at once
                else:
                    self.scheduler.finish(request.request_id, FinishReason.STOP, now)
                output.finished = True
            elif not request.is_finished:
                held_back = longest - 1
        release_to = max(request.streamed_chars, len(request.output_text) - held_back)
        output.new_text = request.output_text[request.streamed_chars : release_to]
        request.streamed_chars = release_to
        if request.is_finished:
            detokenizer.forget(request.request_id)

    def run_until_done(self, max_steps: int | None = None) -> None:
        """Step until nothing is left (offline use and tests)."""
        steps = 0
        while self.has_unfinished():
            self.step()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"still unfinished after {max_steps} steps")
