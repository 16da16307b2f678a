"""A served policy whose hook raises: the server switches to fcfs and keeps serving every
tenant (engine/policy_guard.py), with the real-model engine in its own process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import ADMIN_KEY, KEYS, Server, launch, tenants_data
from tests.user_policies import MODULE, SOURCE

# Fails in on_admit at its third admission (tests/user_policies.py).
BROKEN = f"{MODULE}:Broken"
TENANTS = ("team-a", "team-b")


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("broken-policy")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    server = launch(
        folder,
        "--model", "builtin:tiny", "--device", "cpu", "--kv-tokens", "4096",
        "--policy", BROKEN,
        tenants=tenants_data(),
        python_path=(folder,),
    )  # fmt: skip
    yield server
    server.stop()


def health(server: Server, operator: bool = False) -> dict:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"} if operator else {}
    answer = httpx.get(f"{server.url}/health", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def complete(server: Server, tenant: str, prompt: str) -> tuple[int, int, str | None]:
    """(HTTP status, completion tokens, finish reason) of one completion."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS[tenant], max_retries=0)
    async with client:
        raw = await client.completions.with_raw_response.create(
            model="builtin:tiny", prompt=prompt, max_tokens=6, temperature=0
        )
    result = raw.parse()
    assert result.usage is not None
    return raw.status_code, result.usage.completion_tokens, result.choices[0].finish_reason


def test_a_failing_hook_switches_the_server_to_fcfs_and_every_tenant_is_served(
    broken_server: Server,
):
    server = broken_server
    assert health(server)["policy"] == {"name": "Broken", "failed": False}

    async def ask(count: int, label: str) -> list[tuple[int, int, str | None]]:
        return await asyncio.gather(
            *(
                complete(server, TENANTS[i % 2], f"{label} question {i} from {TENANTS[i % 2]}")
                for i in range(count)
            )
        )

    # Two admissions before the failure, one at a time: the policy's own.
    before = [asyncio.run(ask(1, f"before {i}"))[0] for i in range(2)]
    assert health(server)["policy"]["failed"] is False
    # The third admission raises; these run together, both tenants, across the switch.
    across = asyncio.run(ask(6, "across"))
    after = asyncio.run(ask(4, "after"))
    for status, tokens, finish in [*before, *across, *after]:
        assert status == 200
        assert tokens > 0 and finish in ("length", "stop")

    public = health(server)
    assert public["policy"] == {
        "name": "Broken",
        "failed": True,
        "hook": "on_admit",
        "fallback": "fcfs",
    }
    operator = health(server, operator=True)
    assert operator["policy"]["error"] == "ZeroDivisionError: the third admission"
    assert server.metric("tokenfair:policy_failures_total") == 1.0
    lines = [line for line in server.log.read_text().splitlines() if "failed in its hook" in line]
    assert len(lines) == 1, lines
    assert "'Broken'" in lines[0] and "on_admit" in lines[0] and "fcfs" in lines[0]
    assert "Traceback" not in server.log.read_text()
    # Still serving, every tenant.
    assert all(status == 200 for status, _, _ in asyncio.run(ask(2, "later")))


def test_a_working_policy_reports_itself_on_health(tmp_path: Path):
    server = launch(tmp_path, "--model", "sim:fixed:0.002", "--policy", "vtc")
    try:
        assert health(server)["policy"] == {"name": "vtc", "failed": False}
        assert server.metric("tokenfair:policy_failures_total") == 0.0
    finally:
        server.stop()
