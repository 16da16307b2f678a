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


def usage(job: Job) -> dict[str, Any]:
    request = job.request
    completion = len(request.output_token_ids)
    return {
        "prompt_tokens": request.input_tokens,
        "completion_tokens": completion,
        "total_tokens": request.input_tokens + completion,
        # OpenAI's field: prompt tokens served from the prefix cache (a gateway in
        # front can charge them at its own rate).
        "prompt_tokens_details": {"cached_tokens": request.cached_tokens},
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


def completion_body(job: Job, text: str, logprobs: LogprobsBuilder | None) -> dict[str, Any]:
    state, request = job.state, job.request
    choice: dict[str, Any]
    lp = logprobs.body() if logprobs is not None else None
    if job.prepared.chat:
        kind = "chat.completion"
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": lp,
            "finish_reason": job.finish_reason,
        }
    else:
        kind = "text_completion"
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": job.finish_reason}
    return {
        "id": request.request_id,
        "object": kind,
        "created": job.created,
        "model": state.model.name,
        "choices": [choice],
        "usage": usage(job),
    }


class ChunkEncoder:
    """SSE events for one streaming request."""

    def __init__(self, job: Job) -> None:
        self.job = job
        chat = job.prepared.chat
        head = {
            "id": job.request.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": job.created,
            "model": job.state.model.name,
        }
        self._head = head
        encoded = orjson.dumps(head)[:-1]  # without the closing brace
        if chat:
            self._prefix = b"data: " + encoded + b',"choices":[{"index":0,"delta":{"content":'
            self._suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._prefix = b"data: " + encoded + b',"choices":[{"index":0,"text":'
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
                        "index": 0,
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
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": output.new_text, "logprobs": lp, "finish_reason": reason}
        return self._event({**self._head, "choices": [choice]})

    def usage(self) -> bytes:
        return self._event({**self._head, "choices": [], "usage": usage(self.job)})

    def error(self, status: int, body: dict[str, Any]) -> bytes:
        return self._event(body)
