"""What the endpoints accept of each field: explicit nulls, strict types, and errors
that name the field a client sent."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import Server

NULLABLE = {  # OpenAI marks these nullable: null means the default
    "stream": None, "n": None, "stream_options": None, "max_tokens": None,
    "temperature": None, "top_p": None, "stop": None, "seed": None, "user": None,
    "priority": None, "ignore_eos": None, "top_k": None,
}  # fmt: skip


def post(server: Server, path: str, body: dict[str, object]) -> httpx.Response:
    model = httpx.get(f"{server.url}/v1/models", headers=server.headers()).json()["data"][0]
    body = {"model": model["id"], **body}
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=60)


def test_explicit_nulls_mean_the_defaults(sim_server: Server) -> None:
    completion = post(
        sim_server,
        "/v1/completions",
        {"prompt": "x", **NULLABLE, "echo": None, "logprobs": None, "best_of": None},
    )
    assert completion.status_code == 200, completion.text
    chat = post(
        sim_server,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi", "name": None}],
            **NULLABLE,
            "logprobs": None,
            "top_logprobs": None,
            "max_completion_tokens": None,
        },
    )
    assert chat.status_code == 200, chat.text
    usage = post(
        sim_server,
        "/v1/completions",
        {"prompt": "x", "max_tokens": 2, "stream_options": {"include_usage": None}},
    )
    assert usage.status_code == 200, usage.text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "2"), ("max_tokens", 2.0), ("max_tokens", True), ("stream", 1),
        ("stream", "yes"), ("temperature", "0.5"), ("seed", "3"), ("ignore_eos", "true"),
    ],
)  # fmt: skip
def test_types_are_strict(sim_server: Server, field: str, value: object) -> None:
    answer = post(sim_server, "/v1/completions", {"prompt": "x", "max_tokens": 2, field: value})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == field


def test_an_integer_is_a_number(sim_server: Server) -> None:
    answer = post(sim_server, "/v1/completions", {"prompt": "x", "max_tokens": 2, "top_p": 1})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "stop": ""}, "stop"),
        ({"prompt": "x", "stop": ["a", 3]}, "stop.1"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": [[1, "a"]]}, "prompt.0.1"),
    ],
)
def test_a_value_no_accepted_form_takes_names_its_field(
    sim_server: Server, body: dict[str, object], param: str
) -> None:
    answer = post(sim_server, "/v1/completions", body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param
    assert "more field" not in error["message"]


def test_top_logprobs_needs_logprobs(sim_server: Server) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "top_logprobs": 2}
    refused = post(sim_server, "/v1/chat/completions", body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "top_logprobs" and "logprobs: true" in error["message"]
    assert not error["message"].startswith("invalid field 'top_logprobs': Value error")
    assert post(sim_server, "/v1/chat/completions", {**body, "logprobs": True}).status_code == 200
