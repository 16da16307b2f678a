"""From a request body's sampling fields to the engine's SamplingParams, per choice."""

from __future__ import annotations

from tokenfair.core.request import SamplingParams
from tokenfair.edge.errors import APIError, ErrorCode
from tokenfair.server.protocol import ChatCompletionRequest, CompletionRequest

Body = CompletionRequest | ChatCompletionRequest


def _logit_bias(body: Body, vocab: int | None) -> tuple[tuple[int, float], ...]:
    bias = body.logit_bias or {}
    pairs = tuple(sorted((int(token), value) for token, value in bias.items()))
    if vocab is not None:
        outside = [token for token, _ in pairs if token >= vocab]
        if outside:
            raise APIError(
                400,
                f"invalid field 'logit_bias': token id {outside[0]} is outside the "
                f"vocabulary (size {vocab})",
                param="logit_bias",
                code=ErrorCode.INVALID_VALUE,
            )
    return pairs


def sampling_params(
    body: Body, max_tokens: int, logprobs: int | None, choice: int, vocab: int | None
) -> SamplingParams:
    """The engine's parameters for choice `choice` (0-based) of a prompt. A seeded
    request's choices are seeded `seed`, `seed + 1`, ...: reproducible, and different
    from each other (the same seed would draw the same text n times)."""
    seed = None if body.seed is None else body.seed + choice
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature if body.temperature is not None else 1.0,
            top_p=body.top_p if body.top_p is not None else 1.0,
            top_k=max(0, body.top_k or 0),  # -1 and 0: off, as in vLLM
            seed=seed,
            stop=body.stop_strings(),
            ignore_eos=bool(body.ignore_eos) and not body.stop_token_ids,
            logprobs=logprobs,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            repetition_penalty=body.repetition_penalty or 1.0,
            min_p=body.min_p or 0.0,
            logit_bias=_logit_bias(body, vocab),
        )
    except ValueError as error:
        raise APIError(400, str(error), code=ErrorCode.INVALID_VALUE) from None


def stop_ids(body: Body, eos: frozenset[int]) -> frozenset[int]:
    """The token ids that end the output: the model's end of sequence (unless
    `ignore_eos`), and the request's `stop_token_ids` (even with `ignore_eos`, as vLLM)."""
    extra = frozenset(body.stop_token_ids or ())
    if body.ignore_eos and extra:
        return extra
    return eos | extra
