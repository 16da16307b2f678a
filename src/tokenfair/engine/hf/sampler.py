"""Pick each request's next token from its logits, with its own sampling parameters.

Penalties and logit biases change a row's logits first, greedy rows included (as in
vLLM): repetition over the prompt and the output so far, frequency and presence over the
output, then the biases. Greedy rows (temperature 0, or below GREEDY_BELOW) are then
decided together with one argmax. Other rows apply temperature, then top-k, top-p and
min-p, and draw from the result; the most likely token always survives the filters, so a
draw always has a token to take, whatever parameters a client sent. Logprobs are the
model's own, before any of this (vLLM's default).

A seeded request draws its k-th output token from a generator seeded by (seed, k), so
its text is a pure function of the seed: it comes out the same whatever it was batched
with and whether or not it was preempted and recomputed in between, and the executor
keeps no per-request RNG state to forget. Unseeded requests share the executor's
generator.
"""

from __future__ import annotations

import torch

from tokenfair.core.request import Request, SamplingParams

_SEED_STRIDE = 1_000_003  # spreads (seed, k) pairs over distinct generator seeds
# A temperature this small is greedy, as in vLLM: dividing float32 logits by a
# temperature near 0 overflows them to infinities, whose softmax is NaN.
GREEDY_BELOW = 1e-5


def _step_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * _SEED_STRIDE + step) % (2**63))
    return generator


def penalize(logits: torch.Tensor, request: Request) -> torch.Tensor:
    """One row of float32 logits with the request's penalties and biases applied."""
    params = request.sampling
    logits = logits.clone()
    vocab = logits.numel()
    device = logits.device
    output = request.output_token_ids
    if params.repetition_penalty != 1.0:
        seen = {t for t in (request.all_token_ids() or output) if t < vocab}
        if seen:
            ids = torch.tensor(sorted(seen), device=device)
            values = logits[ids]
            penalty = params.repetition_penalty
            logits[ids] = torch.where(values > 0, values / penalty, values * penalty)
    if (params.frequency_penalty or params.presence_penalty) and output:
        ids = torch.tensor([t for t in output if t < vocab], device=device, dtype=torch.long)
        counts = torch.bincount(ids, minlength=vocab).to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    biases = [(t, b) for t, b in params.logit_bias if t < vocab]
    if biases:
        ids = torch.tensor([t for t, _ in biases], device=device)
        logits[ids] += torch.tensor([b for _, b in biases], device=device, dtype=logits.dtype)
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p applied to one row of float32 logits."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already reach top_p. The first stays
        # even when top_p is so small that it rounds to 0 in float32.
        drop = probs.cumsum(-1) - probs >= params.top_p
        drop[0] = False
        logits = logits.scatter(0, order[drop], float("-inf"))
    if params.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def top_logprobs(logits: torch.Tensor, token: int, count: int) -> dict[int, float]:
    """The chosen token's logprob plus the `count` most likely tokens' (raw model logits)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    result = {token: float(logprobs[token])}
    if count > 0:
        values, ids = torch.topk(logprobs, min(count, logprobs.numel()))
        result.update(zip(ids.tolist(), values.tolist(), strict=True))
    return result


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.shared = torch.Generator(device=self.device)
        self.shared.manual_seed(seed)

    def sample(
        self, logits: torch.Tensor, requests: list[Request]
    ) -> tuple[list[int], dict[str, list[dict[int, float]]] | None]:
        """logits: [S, vocab] float32, one row per request. Returns tokens and logprobs."""
        raw = logits
        penalized = [row for row, request in enumerate(requests) if request.sampling.penalized]
        if penalized:
            logits = logits.clone()
            for row in penalized:
                logits[row] = penalize(raw[row], requests[row])
        tokens = logits.argmax(dim=-1).tolist()
        logprobs: dict[str, list[dict[int, float]]] | None = None
        for row, request in enumerate(requests):
            params = request.sampling
            if params.temperature >= GREEDY_BELOW:
                filtered = filter_logits(logits[row], params)
                probs = torch.softmax(filtered, dim=-1)
                if params.seed is None:
                    generator = self.shared
                else:
                    generator = _step_generator(params.seed, request.num_output_tokens, self.device)
                tokens[row] = int(torch.multinomial(probs, 1, generator=generator))
            if params.logprobs is not None:
                logprobs = logprobs or {}
                logprobs[request.request_id] = [
                    top_logprobs(raw[row], tokens[row], params.logprobs)
                ]
        return tokens, logprobs
