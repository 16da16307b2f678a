"""The example policy (examples/least_attained.py) served by `tokenfair serve --policy
module:Class` on a real model, through the official openai client."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from .conftest import KEYS, Server, launch, tenants_data

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPEC = "least_attained:LeastAttainedService(half_life_s=30)"


@pytest.fixture(scope="module", params=["thread", "process"])
def example_server(request, server_dir: Path) -> Iterator[Server]:
    pytest.importorskip("torch")
    server = launch(
        server_dir,
        "--model", "builtin:tiny", "--device", "cpu", "--kv-tokens", "4096",
        "--policy", SPEC, "--engine", request.param,
        tenants=tenants_data(),
        python_path=(EXAMPLES,),
    )  # fmt: skip
    yield server
    server.stop()


def test_the_example_policy_serves_and_charges_every_tenant(example_server):
    def ask(tenant: str, n: int) -> int:
        client = openai.OpenAI(
            base_url=f"{example_server.url}/v1", api_key=KEYS[tenant], max_retries=0
        )
        model = client.models.list().data[0].id
        result = client.completions.create(
            model=model, prompt=f"{tenant} says {n}", max_tokens=6, temperature=0
        )
        assert result.usage is not None
        return result.usage.completion_tokens

    jobs = [("team-a", n) for n in range(6)] + [("team-b", n) for n in range(2)]
    with ThreadPoolExecutor(8) as pool:
        produced = list(pool.map(lambda job: ask(*job), jobs))
    assert all(tokens >= 1 for tokens in produced)
    # The policy's own figures reach /metrics: service attained, team-b's weighted by 2.
    a = example_server.metric("tokenfair:vtc_counter", tenant="team-a")
    b = example_server.metric("tokenfair:vtc_counter", tenant="team-b")
    assert a > b > 0
