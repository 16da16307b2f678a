"""A small, independent model of the paper's router (S-LoRA/LightLLM, SPEC section 5).

Written from the description of that router, not from tokenfair's scheduler, so that a
differential test can check the scheduler against it. One loop iteration is one step;
a step either prefills newly admitted prompts or decodes one token for every running
request. The rules:

- admission is tried when nothing runs, or once 10 decode steps have passed since the
  last admission; the count restarts only when something was admitted, so after a
  failed attempt admission is tried again at every step;
- a running request with k outputs holds prompt + k tokens and will grow by
  max_tokens - k - 1 more (its last token is never written to the cache); a candidate
  counts as prompt + 1 growing by max_tokens - 1;
- sorted by remaining growth, longest first, the peak is the largest of
  (growth of the i-th) x i + (tokens held by the first i); the candidate is admitted
  only while that peak is strictly below the pool minus 32 tokens (a rank-8 LoRA
  adapter) for each distinct client among the batch and the candidates;
- at most `max_num_seqs` running, at most `max_prefill_tokens` new prompt tokens per
  admission, and admission stops at the first candidate that does not fit;
- queue order: FCFS by arrival, or the artifact's VTC: the waiting client with the
  smallest counter, ties to the client seen first; an arriving
  client with no waiting request is lifted to the smallest counter among other
  waiting clients (none if nobody waits); prompts are charged at admission, 2 per
  running request at every decode step, and whenever a request of a step's batch
  finishes, 2 more to every request of that batch. The first output
  token comes from the prefill and is not charged.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelRequest:
    request_id: str
    client: str
    arrival: int  # the step before which it arrives
    prompt: int
    max_tokens: int  # also its output length
    outputs: int = 0


@dataclass
class RouterModel:
    pool: int
    max_num_seqs: int
    max_prefill_tokens: int
    vtc: bool  # False: FCFS
    interval: int = 10
    adapter_tokens: int = 32
    waiting: list[ModelRequest] = field(default_factory=list)
    running: list[ModelRequest] = field(default_factory=list)
    counter: dict[str, float] = field(default_factory=dict)  # first-seen order
    steps_since_admission: int = 0
    admissions: list[tuple[int, str]] = field(default_factory=list)  # (step, request id)

    # --- arrivals ---
    def arrive(self, request: ModelRequest) -> None:
        waiting_clients = {r.client for r in self.waiting}
        self.counter.setdefault(request.client, 0.0)
        if self.vtc and request.client not in waiting_clients and waiting_clients:
            lowest = min(self.counter[c] for c in waiting_clients)
            self.counter[request.client] = max(self.counter[request.client], lowest)
        self.waiting.append(request)

    # --- the queue ---
    def _next_candidate(self) -> ModelRequest | None:
        if not self.waiting:
            return None
        if not self.vtc:
            return self.waiting[0]
        # `counter` lists clients in first-seen order and min() keeps the first of equals.
        waiting_clients = [c for c in self.counter if any(r.client == c for r in self.waiting)]
        client = min(waiting_clients, key=lambda c: self.counter[c])
        return next(r for r in self.waiting if r.client == client)

    # --- memory ---
    def _entry(self, request: ModelRequest) -> tuple[int, int]:
        """(tokens held, tokens still to grow) at the moment of the check."""
        if request.outputs == 0:
            return request.prompt + 1, request.max_tokens - 1
        return request.prompt + request.outputs, request.max_tokens - request.outputs - 1

    def _fits(self, batch: list[ModelRequest]) -> bool:
        entries = sorted((self._entry(r) for r in batch), key=lambda e: -e[1])
        peak, held = 0, 0
        for i, (tokens, growth) in enumerate(entries, start=1):
            held += tokens
            peak = max(peak, growth * i + held)
        return peak < self.pool - self.adapter_tokens * len({r.client for r in batch})

    def _try_admit(self, step: int) -> list[ModelRequest]:
        admitted: list[ModelRequest] = []
        prompt_tokens = 0
        while (candidate := self._next_candidate()) is not None:
            batch = self.running + admitted + [candidate]
            if not (
                self._fits(batch)
                and len(batch) <= self.max_num_seqs
                and prompt_tokens + candidate.prompt <= self.max_prefill_tokens
            ):
                break
            self.waiting.remove(candidate)
            admitted.append(candidate)
            prompt_tokens += candidate.prompt
            self.counter[candidate.client] += candidate.prompt
            self.admissions.append((step, candidate.request_id))
        return admitted

    # --- steps ---
    def _run(self, batch: list[ModelRequest], decode: bool) -> None:
        for request in batch:
            if decode:
                self.counter[request.client] += 2  # the prefill's token is free
            request.outputs += 1
        finished = [r for r in batch if r.outputs >= r.max_tokens]
        if finished and self.vtc:
            for request in batch:
                self.counter[request.client] += 2
        for request in finished:
            batch.remove(request)

    def step(self, step: int) -> None:
        attempt = not self.running or self.steps_since_admission >= self.interval
        if attempt and self.waiting:
            admitted = self._try_admit(step)
            if admitted:
                self._run(admitted, decode=False)
                self.running.extend(admitted)
                self.steps_since_admission = 0
                return
        if self.running:
            self._run(self.running, decode=True)
            self.steps_since_admission += 1

    def done(self) -> bool:
        return not self.waiting and not self.running


def run_model(model: RouterModel, requests: list[ModelRequest], max_steps: int) -> None:
    """Arrivals join before the step they arrive at; step until everything finished."""
    pending = sorted(requests, key=lambda r: r.arrival)
    for step in range(max_steps):
        while pending and pending[0].arrival <= step:
            model.arrive(pending.pop(0))
        if not pending and model.done():
            return
        model.step(step)
    raise AssertionError(f"the router model did not finish in {max_steps} steps")
