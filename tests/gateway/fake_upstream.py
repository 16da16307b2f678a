"""A small real OpenAI-compatible upstream for the gateway's tests and benchmark.

`python -m tests.gateway.fake_upstream --port P [--token-interval S] [--fail-status N]`

It streams SSE at a fixed interval per token (`tok ` per chunk, `max_tokens` of them,
16 by default), reports usage (prompt tokens = words + 1, deliberately unlike the
gateway's estimate; a body with `fake_no_usage: true` gets a non-streaming answer
without it), notices client disconnects, and exposes what it is doing at
/stats (with the most requests it had in flight at once, and the last request body and
x-tokenfair-tenant header it received) and, in tokenfair's metric names, at /metrics. Raw ASGI, so that it is never
the bottleneck of a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

import orjson
import uvicorn

DEFAULT_TOKENS = 16


class FakeUpstream:
    def __init__(self, token_interval: float, fail_status: int | None, name: str) -> None:
        self.token_interval = token_interval
        self.fail_status = fail_status
        self.name = name
        self.running = 0
        # The most sequences in flight at once: one per choice, as vLLM counts them.
        self.peak_running = 0
        self.last_body: Any = None  # the last completion request's body, as received
        # ... and its x-tokenfair-tenant header (None: it had none)
        self.last_tenant_header: str | None = None
        self.started = 0
        self.peers: set[str] = set()  # client address:port of each connection used
        self.finished = 0
        self.aborted = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path in ("/v1/completions", "/v1/chat/completions") and scope["method"] == "POST":
            if scope.get("client"):
                host, port = scope["client"]
                self.peers.add(f"{host}:{port}")
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            self.last_body = orjson.loads(body)
            self.last_tenant_header = next(
                (v.decode("latin-1") for k, v in scope["headers"] if k == b"x-tokenfair-tenant"),
                None,
            )
            await self.complete(path.endswith("chat/completions"), self.last_body, receive, send)
        elif path == "/health":
            await self.json(send, 200, {"status": "ok"})
        elif path == "/stats":
            await self.json(
                send,
                200,
                {
                    "name": self.name,
                    "running": self.running,
                    "peak_running": self.peak_running,
                    "last_body": self.last_body,
                    "last_tenant_header": self.last_tenant_header,
                    "started": self.started,
                    "connections": len(self.peers),
                    "finished": self.finished,
                    "aborted": self.aborted,
                },
            )
        elif path == "/metrics":
            text = f"# TYPE tokenfair:num_requests_running gauge\ntokenfair:num_requests_running {self.running}\ntokenfair:num_requests_waiting 0\n"
            await self.raw(send, 200, text.encode(), b"text/plain")
        else:
            await self.json(
                send,
                404,
                {
                    "error": {
                        "message": "no such endpoint",
                        "type": "not_found_error",
                        "param": None,
                        "code": None,
                    }
                },
            )

    async def raw(self, send: Any, status: int, body: bytes, kind: bytes) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def json(self, send: Any, status: int, data: Any) -> None:
        await self.raw(send, status, orjson.dumps(data), b"application/json")

    async def complete(self, chat: bool, request: dict[str, Any], receive: Any, send: Any) -> None:
        if self.fail_status is not None:
            await self.json(
                send,
                self.fail_status,
                {
                    "error": {
                        "message": "failing on purpose",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                },
            )
            return
        n = int(request.get("max_tokens") or request.get("max_completion_tokens") or DEFAULT_TOKENS)
        if chat:
            text = " ".join(str(m.get("content", "")) for m in request.get("messages", []))
        else:
            prompt = request.get("prompt", "")
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        usage = {
            "prompt_tokens": len(text.split()) + 1,
            "completion_tokens": n,
            "total_tokens": len(text.split()) + 1 + n,
        }
        kind = "chat.completion" if chat else "text_completion"
        model = request.get("model", "fake")
        self.started += 1
        sequences = int(request.get("n") or 1)
        self.running += sequences
        self.peak_running = max(self.peak_running, self.running)
        try:
            if not request.get("stream"):
                if self.token_interval:
                    await asyncio.sleep(self.token_interval * n)
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": "tok " * n}
                else:
                    choice["text"] = "tok " * n
                answer = {
                    "id": "cmpl-fake",
                    "object": kind,
                    "created": 0,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
                if request.get("fake_no_usage"):  # as some servers answer
                    del answer["usage"]
                await self.json(send, 200, answer)
                self.finished += 1
                return
            await self.stream(
                chat,
                model,
                n,
                usage,
                bool((request.get("stream_options") or {}).get("include_usage")),
                receive,
                send,
            )
        finally:
            self.running -= sequences

    async def stream(
        self,
        chat: bool,
        model: str,
        n: int,
        usage: dict[str, int],
        include_usage: bool,
        receive: Any,
        send: Any,
    ) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        kind = "chat.completion.chunk" if chat else "text_completion"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        try:
            for i in range(n):
                if self.token_interval:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(gone.wait(), self.token_interval)
                if gone.is_set():
                    self.aborted += 1
                    return
                choice: dict[str, Any] = {
                    "index": 0,
                    "finish_reason": "length" if i == n - 1 else None,
                }
                if chat:
                    choice["delta"] = (
                        {"content": "tok "} if i else {"role": "assistant", "content": "tok "}
                    )
                else:
                    choice["text"] = "tok "
                chunk = {
                    "id": "cmpl-fake",
                    "object": kind,
                    "created": 0,
                    "model": model,
                    "choices": [choice],
                }
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
                        "more_body": True,
                    }
                )
            tail = b""
            if include_usage:
                tail = (
                    b"data: "
                    + orjson.dumps(
                        {
                            "id": "cmpl-fake",
                            "object": kind,
                            "created": 0,
                            "model": model,
                            "choices": [],
                            "usage": usage,
                        }
                    )
                    + b"\n\n"
                )
            await send(
                {
                    "type": "http.response.body",
                    "body": tail + b"data: [DONE]\n\n",
                    "more_body": False,
                }
            )
            self.finished += 1
        finally:
            watcher.cancel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-interval", type=float, default=0.0)
    parser.add_argument("--fail-status", type=int, default=None)
    parser.add_argument("--name", default="fake")
    args = parser.parse_args()
    app = FakeUpstream(args.token_interval, args.fail_status, args.name)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


if __name__ == "__main__":
    main()
