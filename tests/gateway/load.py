"""Clients for the gateway's fairness tests: closed loops of requests per tenant."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import openai

from tests.gateway.processes import KEYS


@dataclass
class Done:
    tenant: str
    start: float
    first: float  # first token, seconds after start
    finish: float
    prompt: int
    output: int

    @property
    def service(self) -> int:
        return self.prompt + 2 * self.output


async def one_stream(client: openai.AsyncOpenAI, tenant: str, max_tokens: int, t0: float) -> Done:
    start = time.perf_counter()
    first = None
    output = 0
    prompt = 0
    stream = await client.completions.create(
        model="fake",
        prompt="hello world",
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and first is None:
            first = time.perf_counter()
        if chunk.usage is not None:
            prompt, output = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    end = time.perf_counter()
    return Done(tenant, start - t0, (first or end) - start, end - t0, prompt, output)


async def closed_loop(
    url: str,
    tenant: str,
    concurrency: int,
    max_tokens: int,
    until: float,
    t0: float,
    out: list[Done],
) -> None:
    client = openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=60
    )

    async def worker() -> None:
        while time.perf_counter() < until:
            out.append(await one_stream(client, tenant, max_tokens, t0))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
