"""Greedy output through the server equals `tokenfair generate` and `tokenfair.LLM`."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import Server

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPTS = ["Hello", "The quick brown fox", "tokenfair serves tenants fairly. "]


def server_text(server: Server, prompt: str, max_tokens: int) -> dict:
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={
            "model": "builtin:tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        headers=server.headers(),
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_greedy_equals_generate_and_llm(tiny_server):
    from tokenfair.core.request import SamplingParams
    from tokenfair.llm import LLM, generate_command

    llm = LLM("builtin:tiny", device="cpu", kv_tokens=8192)
    offline = llm.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0))
    for prompt, completion in zip(PROMPTS, offline, strict=True):
        served = server_text(tiny_server, prompt, 24)
        assert served["choices"][0]["text"] == completion.text
        assert served["usage"]["completion_tokens"] == len(completion.token_ids)
        assert served["usage"]["prompt_tokens"] == len(completion.prompt_token_ids)
    printed = "".join(generate_command("builtin:tiny", PROMPTS[0], max_tokens=16, device="cpu"))
    assert server_text(tiny_server, PROMPTS[0], 16)["choices"][0]["text"] == printed


def test_greedy_stream_equals_whole_under_concurrency(tiny_server):
    import asyncio

    async def main() -> None:
        async with httpx.AsyncClient(
            base_url=tiny_server.url, headers=tiny_server.headers(), timeout=120
        ) as c:

            async def streamed(prompt: str) -> str:
                text = ""
                body = {
                    "model": "builtin:tiny",
                    "prompt": prompt,
                    "max_tokens": 12,
                    "temperature": 0,
                    "stream": True,
                }
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            import json

                            text += json.loads(line[6:])["choices"][0]["text"]
                return text

            texts = await asyncio.gather(*(streamed(p) for p in PROMPTS * 3))
            for prompt, text in zip(PROMPTS * 3, texts, strict=True):
                assert text == server_text(tiny_server, prompt, 12)["choices"][0]["text"]

    asyncio.run(main())


@pytest.mark.parametrize("params", [{"temperature": 1e-300}, {"temperature": 1.0, "top_p": 1e-300}])
def test_extreme_sampling_parameters_are_served_greedily(tiny_server, params):
    """The edges of what the schema allows neither fail the request nor the engine."""
    greedy = server_text(tiny_server, PROMPTS[0], 8)["choices"][0]
    body = {"model": "builtin:tiny", "prompt": PROMPTS[0], "max_tokens": 8, **params}
    answer = httpx.post(
        f"{tiny_server.url}/v1/completions", json=body, headers=tiny_server.headers(), timeout=60
    )
    assert answer.status_code == 200
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == greedy["finish_reason"] != "abort"
    assert choice["text"] == greedy["text"]
    assert httpx.get(f"{tiny_server.url}/health", timeout=10).status_code == 200
