"""Response bodies in OpenAI's shapes, whole (JSON) or as server-sent events.

Streaming is the hot path: every chunk of a request shares its id, model and creation
time, so each request pre-encodes its chunk's JSON around the text once and a token
costs one orjson string encode and two concatenations.
"""

from __future__ import annotations

from typing import Any

import orjson

from tokenfair.engine.engine import RequestOutput
from tokenfair.server.generation import Job
from tokenfair.server.model import ModelTokenizer

DONE = b"data: [DONE]\n\n"


def usage_of(jobs: list[Job], per_prompt: int, completion: int | None = None) -> dict[str, Any]:
    """One answer's usage: each prompt counted once (its first choice's), as OpenAI
    counts them, every choice's output; or, for an answer cut short, the `completion`
    tokens it was sent."""
    prompts = jobs[::per_prompt]
    prompt = sum(job.request.input_tokens for job in prompts)
    if completion is None:
        completion = sum(len(job.request.output_token_ids) for job in jobs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        # OpenAI's field: prompt tokens served from the prefix cache (a gateway in
        # front can charge them at its own rate).
        "prompt_tokens_details": {
            "cached_tokens": sum(job.request.cached_tokens for job in prompts)
        },
    }


class LogprobsBuilder:
    """Accumulates per-token logprobs in the endpoint's shape."""

    def __init__(self, tokenizer: ModelTokenizer, top: int, chat: bool) -> None:
        self.tokenizer = tokenizer
        self.top = top
        self.chat = chat
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[str, float]]] = []
        self.text_offset: list[int] = []
        self._offset = 0

    def add(self, output: RequestOutput) -> None:
        for token, entry in zip(output.new_token_ids, output.logprobs or (), strict=False):
            text = self.tokenizer.decode([token])
            self.tokens.append(text)
            self.token_logprobs.append(entry.get(token, float("-inf")))
            ranked = sorted(entry.items(), key=lambda kv: -kv[1])[: self.top]
            self.top_logprobs.append([(self.tokenizer.decode([t]), lp) for t, lp in ranked])
            self.text_offset.append(self._offset)
            self._offset += len(text)

    def reset(self) -> None:
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []

    def body(self) -> dict[str, Any]:
        if self.chat:
            return {
                "content": [
                    {
                        "token": token,
                        "logprob": lp,
                        "bytes": list(token.encode("utf-8")),
                        "top_logprobs": [
                            {"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))}
                            for t, v in top
                        ],
                    }
                    for token, lp, top in zip(
                        self.tokens, self.token_logprobs, self.top_logprobs, strict=True
                    )
                ]
            }
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": [dict(top) for top in self.top_logprobs],
            "text_offset": self.text_offset,
        }


def choice_body(
    job: Job, index: int, text: str, logprobs: LogprobsBuilder | None
) -> dict[str, Any]:
    lp = logprobs.body() if logprobs is not None else None
    if job.prepared.chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": lp,
            "finish_reason": job.finish_reason,
        }
    return {"index": index, "text": text, "logprobs": lp, "finish_reason": job.finish_reason}


def answer_body(
    choices: list[tuple[Job, str, LogprobsBuilder | None]], per_prompt: int
) -> dict[str, Any]:
    """The whole answer: one choice per engine request, in order (index = position)."""
    first = choices[0][0]
    return {
        "id": first.request.request_id,
        "object": "chat.completion" if first.prepared.chat else "text_completion",
        "created": first.created,
        "model": first.state.model.name,
        "choices": [choice_body(job, i, text, lp) for i, (job, text, lp) in enumerate(choices)],
        "usage": usage_of([job for job, _, _ in choices], per_prompt),
    }


class ChunkEncoder:
    """SSE events for one streaming engine request: choice `index` of an answer whose
    chunks all carry the id of `first` (the request itself, unless it is not the first
    choice)."""

    def __init__(self, job: Job, index: int = 0, first: Job | None = None) -> None:
        self.job = job
        self.index = index
        chat = job.prepared.chat
        lead = first or job
        head = {
            "id": lead.request.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": lead.created,
            "model": job.state.model.name,
        }
        self._head = head
        encoded = orjson.dumps(head)[:-1]  # without the closing brace
        choice = b',"choices":[{"index":%d,' % index
        if chat:
            self._prefix = b"data: " + encoded + choice + b'"delta":{"content":'
            self._suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._prefix = b"data: " + encoded + choice + b'"text":'
            self._suffix = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self.logprobs = (
            LogprobsBuilder(job.state.model.tokenizer, job.prepared.logprobs or 0, chat)
            if job.prepared.logprobs is not None
            else None
        )

    def _event(self, body: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def first(self) -> bytes:
        """Chat streams open with the assistant's role, as OpenAI's do."""
        if not self.job.prepared.chat:
            return b""
        return self._event(
            {
                **self._head,
                "choices": [
                    {
                        "index": self.index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )

    def outputs(self, batch: list[RequestOutput]) -> bytes:
        """The events for a batch of outputs; the last one carries the finish reason."""
        return b"".join([self.output(output) for output in batch])

    def output(self, output: RequestOutput) -> bytes:
        """The event for one output (b"" when it carries nothing to send)."""
        if self.logprobs is not None or output.finished:
            return self._full(output)
        text = output.new_text
        return self._prefix + orjson.dumps(text) + self._suffix if text else b""

    def _full(self, output: RequestOutput) -> bytes:
        job = self.job
        lp = None
        if self.logprobs is not None:
            self.logprobs.reset()
            self.logprobs.add(output)
            lp = self.logprobs.body()
        if not output.new_text and not output.finished and not (lp and any(lp.values())):
            return b""
        reason = job.finish_reason if output.finished else None
        if job.prepared.chat:
            delta = {"content": output.new_text} if output.new_text else {}
            choice = {"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {
                "index": self.index,
                "text": output.new_text,
                "logprobs": lp,
                "finish_reason": reason,
            }
        return self._event({**self._head, "choices": [choice]})

    def event_with(self, fields: dict[str, Any]) -> bytes:
        """An event of this answer's id, model and time with these fields."""
        return self._event({**self._head, **fields})

    def error(self, status: int, body: dict[str, Any]) -> bytes:
        return self._event(body)
