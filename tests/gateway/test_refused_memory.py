"""A refused request lets its body go before its answer is sent: a prompt of 500,000
token ids is 3.9 MB of JSON and some 14.5 MB once parsed, and 32 refused at once held
623 MB while their 400s went out to clients reading slowly."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import yaml

from tokenfair.edge.tenants import hash_key
from tokenfair.gateway.app import create_app
from tokenfair.gateway.config import parse_config

KEY = "tenant-key"


def _app(tmp_path: Path) -> Any:
    config = {
        "tenants": {
            "tenants": [
                {"name": "a", "key_sha256": [hash_key(KEY)], "max_tokens_per_request": 4096}
            ]
        },
        "upstreams": [{"url": "http://127.0.0.1:9", "models": ["m"], "max_concurrent": 1}],
    }
    return create_app(parse_config(yaml.safe_dump(config), str(tmp_path / "gw.yaml"), tmp_path))


def test_a_prompt_refused_as_too_long_is_let_go_before_the_answer_goes_out(
    tmp_path: Path,
) -> None:
    app = _app(tmp_path)
    body = orjson.dumps({"model": "m", "prompt": list(range(500_000)), "max_tokens": 8})
    assert len(body) > 3_000_000
    held: list[int] = []
    answers: list[dict[str, Any]] = []

    async def run() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)  # the client stays: no disconnect
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                # What is still allocated as the answer goes out, the raw body aside
                # (the test holds it): a parsed prompt would be some 14 MB more.
                held.append(tracemalloc.get_traced_memory()[0])
            answers.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/completions",
            "raw_path": b"/v1/completions",
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"authorization", f"Bearer {KEY}".encode()),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        tracemalloc.start()
        try:
            await app(scope, receive, send)
        finally:
            tracemalloc.stop()

    asyncio.run(run())
    start = next(a for a in answers if a["type"] == "http.response.start")
    assert start["status"] == 400
    error = orjson.loads(
        b"".join(a.get("body", b"") for a in answers if a["type"] == "http.response.body")
    )
    assert error["error"]["code"] == "context_length_exceeded"
    assert held and held[0] < 4_000_000, held
