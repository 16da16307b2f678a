"""Property-based requests from /openapi.json: nothing a client sends produces a 5xx.

Schemathesis generates bodies, headers and paths from the schema the server
publishes (valid and invalid ones); every answer must be below 500 and every error
must come in OpenAI's shape. Bounded to a few dozen examples per operation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.server.conftest import ADMIN_KEY, KEYS, Server, launch, tenants_data

schemathesis = pytest.importorskip("schemathesis")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fuzz_server(server_dir) -> Iterator[Server]:
    server = launch(
        server_dir, "--model", "sim:zero", "--kv-tokens", "65536", "--api-docs",
        tenants=tenants_data(),
    )  # fmt: skip
    yield server
    server.stop()


def check(case, server: Server) -> None:
    key = ADMIN_KEY if case.path.startswith("/admin") else KEYS["team-a"]
    response = case.call(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code < 500, (
        f"{case.method} {case.path}: {response.status_code} {response.text}"
    )
    if response.status_code >= 400 and response.status_code != 499:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]


def test_no_server_errors(fuzz_server):
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable

    unsatisfiable: list[str] = []

    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    for operation, mode in itertools.product(operations, modes):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=15,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:
            check(case, fuzz_server)

        try:
            run()
        except Unsatisfiable:
            # Nothing to make invalid: /health and /metrics take no input and no key.
            assert mode is schemathesis.GenerationMode.NEGATIVE, operation.path
            unsatisfiable.append(operation.path)
    assert set(unsatisfiable) <= {"/health", "/metrics"}
    assert "internal error" not in fuzz_server.log.read_text()


def test_openapi_describes_the_request_bodies(fuzz_server):
    import httpx

    spec = httpx.get(f"{fuzz_server.url}/openapi.json").json()
    body = spec["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    assert body == {"$ref": "#/components/schemas/CompletionRequest"}
    fields = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"prompt", "max_tokens", "stream", "stop", "seed", "priority", "n", "logprobs"} <= set(
        fields
    )
    assert {"maximum": 128, "minimum": 1, "type": "integer"} in fields["n"]["anyOf"]
    # Fields known and refused unless off are in the schema, saying so.
    assert "Refused unless off" in fields["echo"]["description"]
    assert fields["max_tokens"]["anyOf"][0]["type"] == "integer"
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "max_completion_tokens", "top_logprobs", "stream_options"} <= set(chat)
    # What the server answers, not FastAPI's defaults: 400 in OpenAI's shape, not 422.
    operations = [op for ops in spec["paths"].values() for op in ops.values()]
    assert not any("422" in op["responses"] for op in operations)
    weight = spec["paths"]["/admin/tenants/{name}/weight"]["post"]["responses"]
    assert {"400", "401", "403", "404"} <= set(weight)
    assert spec["paths"]["/health"]["get"]["security"] == []
    # /metrics: the admin key on the API port (or the metrics port, without a key).
    assert "security" not in spec["paths"]["/metrics"]["get"]
    assert {"401", "403", "404"} <= set(spec["paths"]["/metrics"]["get"]["responses"])
    assert "security" not in spec["paths"]["/v1/models"]["get"]  # the global bearer applies
