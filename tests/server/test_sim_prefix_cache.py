"""`sim:` prompts get ids from their content, so the prefix cache sees real reuse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import ADMIN_KEY, Server, launch, tenants_data
from tokenfair.engine.sim.wall_clock import SimTokenizer

SYSTEM = "You are the support assistant of a bicycle shop; answer briefly and politely. " * 8


@pytest.fixture(scope="module")
def caching_sim(server_dir: Path) -> Iterator[Server]:
    server = launch(
        server_dir,
        "--model", "sim:zero", "--enable-prefix-caching", "--block-size", "16",
        tenants=tenants_data(),
    )  # fmt: skip
    yield server
    server.stop()


def _hits_and_queries(server: Server) -> tuple[float, float]:
    values = server.metrics()
    return (
        values.get(("tokenfair:prefix_cache_hits_total", ()), 0.0),
        values.get(("tokenfair:prefix_cache_queries_total", ()), 0.0),
    )


def _ask(server: Server, tenant: str, question: str) -> int:
    """One chat turn under SYSTEM; returns the prompt tokens the server counted."""
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": "sim:zero",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ],
            "max_tokens": 2,
        },
        headers=server.headers(tenant),
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


def test_ids_follow_the_text() -> None:
    tokenizer = SimTokenizer()
    assert tokenizer.encode("abcdefgh") == tokenizer.encode("abcd") + tokenizer.encode("efgh")
    assert tokenizer.encode("abcd") != tokenizer.encode("abce")
    assert len(tokenizer.encode("x" * 4001)) == 1001  # 4 bytes a token, rounded up
    assert len(tokenizer.encode("")) == 1


def test_a_shared_system_prompt_hits_within_a_tenant_only(caching_sim: Server) -> None:
    hits0, queries0 = _hits_and_queries(caching_sim)
    prompt = _ask(caching_sim, "team-a", "Do you repair tyres?")
    hits1, queries1 = _hits_and_queries(caching_sim)
    assert queries1 - queries0 == prompt
    assert hits1 == hits0  # the first time, nothing is cached

    # Another question under the same system prompt: its blocks are found again.
    _ask(caching_sim, "team-a", "When do you open on Sundays?")
    hits2, _ = _hits_and_queries(caching_sim)
    system_blocks = len(SimTokenizer().encode(f"system: {SYSTEM}\n")) // 16
    assert hits2 - hits1 == 16 * system_blocks

    # The same prompt from another tenant: its cache is salted apart.
    _ask(caching_sim, "team-b", "When do you open on Sundays?")
    hits3, _ = _hits_and_queries(caching_sim)
    assert hits3 == hits2


def test_different_prompts_share_nothing(caching_sim: Server) -> None:
    def complete(prompt: str) -> None:
        response = httpx.post(
            f"{caching_sim.url}/v1/completions",
            json={"model": "sim:zero", "prompt": prompt, "max_tokens": 1},
            headers=caching_sim.headers("team-a"),
            timeout=30,
        )
        assert response.status_code == 200, response.text

    complete("alpha " * 40)
    hits0, _ = _hits_and_queries(caching_sim)
    complete("omega " * 40)  # as long, other text (identical placeholder ids would all hit)
    hits1, _ = _hits_and_queries(caching_sim)
    assert hits1 == hits0
    complete("alpha " * 40 + "and more")
    hits2, _ = _hits_and_queries(caching_sim)
    assert hits2 - hits1 == 16 * 3  # 60 tokens of "alpha " text: 3 full blocks


@pytest.fixture(scope="module")
def dlpm_sim(server_dir: Path) -> Iterator[Server]:
    server = launch(
        server_dir,
        "--model", "sim:zero", "--enable-prefix-caching", "--block-size", "16",
        "--policy", "dlpm", "--charge-cached-tokens", "0",
        tenants=tenants_data(),
    )  # fmt: skip
    yield server
    server.stop()


def test_dlpm_serves_and_cached_prompt_tokens_are_reported_and_priced(dlpm_sim: Server) -> None:
    def counter() -> float:
        rows = httpx.get(
            f"{dlpm_sim.url}/admin/tenants",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        ).json()
        return next(r["counter"] for r in rows["data"] if r["name"] == "team-a")

    usages = []
    for question in ("Do you repair tyres?", "When do you open on Sundays?"):
        before = counter()
        response = httpx.post(
            f"{dlpm_sim.url}/v1/chat/completions",
            json={
                "model": "sim:zero",
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
                "max_tokens": 2,
            },
            headers=dlpm_sim.headers("team-a"),
            timeout=30,
        )
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        usages.append(usage)
        # Cached prompt tokens cost nothing at --charge-cached-tokens 0.
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        expected = usage["prompt_tokens"] - cached + 2 * usage["completion_tokens"]
        assert counter() - before == pytest.approx(expected)
    assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0
    system_blocks = len(SimTokenizer().encode(f"system: {SYSTEM}\n")) // 16
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] == 16 * system_blocks
