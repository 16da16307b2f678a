"""Offline batch generation, like vLLM's `LLM` class.

    from tokenfair import LLM
    from tokenfair.core.request import SamplingParams

    llm = LLM("builtin:tiny")            # or a local transformers model directory
    for c in llm.generate(["Hello", "Hi"], SamplingParams(max_tokens=32)):
        print(c.text)

All prompts go into one engine at once and run with continuous batching under the
engine's scheduler; completions come back in prompt order.

`builtin:tiny` has random weights: its text is meaningless bytes. It is there to run the
serving path anywhere; pass a local transformers model directory for real text.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tokenfair.core.request import FinishReason, Request, SamplingParams

Prompt = str | list[int]


@dataclass(slots=True)
class Completion:
    prompt: Prompt
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[dict[int, float]] | None = None


class LLM:
    """A model plus an engine for offline generation.

    `model`: "builtin:tiny", a local directory, or a `LoadedModel`. Engine options are
    any `make_hf_engine` keyword: policy, kv_tokens, max_num_seqs, max_batched_tokens,
    block_size, swap_tokens, preemption, attention, seed, ...
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str | None = None,
        dtype: str | None = None,
        **engine_options: Any,
    ) -> None:
        from tokenfair.engine.hf.factory import make_hf_engine
        from tokenfair.engine.hf.loader import LoadedModel, load_model

        self.loaded = model if isinstance(model, LoadedModel) else load_model(model, device, dtype)
        if self.loaded.tokenizer is None:
            raise ValueError(f"model {self.loaded.name} has no tokenizer: LLM needs one")
        self.tokenizer = self.loaded.tokenizer
        self.engine = make_hf_engine(self.loaded, **engine_options)
        self._ids = itertools.count()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Complete each prompt (text, or token ids); one SamplingParams for all or one each."""
        batch = _prompt_list(prompts)
        if sampling is None or isinstance(sampling, SamplingParams):
            params = [sampling or SamplingParams()] * len(batch)
        else:
            params = list(sampling)
            if len(params) != len(batch):
                raise ValueError(f"{len(params)} sampling params for {len(batch)} prompts")
        requests = [self._request(p, s) for p, s in zip(batch, params, strict=True)]
        for request in requests:
            self._add(request)
        logprobs: dict[str, list[dict[int, float]]] = {}
        while self.engine.has_unfinished():
            for output in self.engine.step():
                if output.logprobs:
                    logprobs.setdefault(output.request_id, []).extend(output.logprobs)
        return [
            self._completion(p, r, logprobs.get(r.request_id))
            for p, r in zip(batch, requests, strict=True)
        ]

    def stream(self, prompt: Prompt, sampling: SamplingParams | None = None) -> Iterator[str]:
        """Complete one prompt, yielding its text piece by piece as the engine makes it.

        Stopping the iteration early aborts the request.
        """
        request = self._request(prompt, sampling or SamplingParams())
        self._add(request)
        try:
            while self.engine.has_unfinished():
                for output in self.engine.step():
                    if output.request_id == request.request_id and output.new_text:
                        yield output.new_text
        finally:
            if request.finish_reason is None:
                self.engine.abort(request.request_id)

    def _add(self, request: Request) -> None:
        if not self.engine.add_request(request):
            raise ValueError(
                f"prompt of {request.input_tokens} tokens + max_tokens {request.max_tokens} "
                "can never fit in the KV pool; raise kv_tokens or lower max_tokens"
            )

    def chat(
        self, messages: list[dict[str, str]], sampling: SamplingParams | None = None
    ) -> Completion:
        """Reply to one conversation, rendered with the model's chat template."""
        return self.generate([self.tokenizer.chat_prompt(messages)], sampling)[0]

    def _request(self, prompt: Prompt, sampling: SamplingParams) -> Request:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        sampling = replace(sampling, stop=tuple(sampling.stop))  # a private copy per request
        return Request(
            request_id=f"llm-{next(self._ids)}",
            client="offline",
            input_tokens=len(ids),
            arrival_s=self.engine.clock.now(),
            sampling=sampling,
            prompt_token_ids=ids,
            eos_token_ids=self.tokenizer.eos_token_ids,
        )

    def _completion(
        self, prompt: Prompt, request: Request, logprobs: list[dict[int, float]] | None
    ) -> Completion:
        reason = request.finish_reason
        return Completion(
            prompt=prompt,
            prompt_token_ids=list(request.prompt_token_ids or []),
            token_ids=list(request.output_token_ids),
            text=request.output_text,
            finish_reason=reason.value if isinstance(reason, FinishReason) else None,
            logprobs=logprobs,
        )


def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text or token ids) or many, as a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(p, int) for p in items):
        return [[int(p) for p in items]]  # type: ignore[arg-type]
    return [p if isinstance(p, str) else list(p) for p in items]  # type: ignore[arg-type]


def generate_command(
    model: str,
    prompt: str,
    max_tokens: int = 64,
    temperature: float = 0.0,
    seed: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> Iterator[str]:
    """What `tokenfair generate --model M --prompt TEXT ...` prints, piece by piece."""
    llm = LLM(model, device=device, dtype=dtype, kv_tokens=max(4096, 2 * (max_tokens + 4096)))
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    return llm.stream(prompt, sampling)
