"""OpenAI's request fields through the official client: each honoured (n, prompt lists,
penalties, logit_bias, top_k -1) or refused with a 400 naming it (structured output,
tools, echo...), never accepted and silently ignored."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import Server
from tests.server.test_openai_client import client, model_of


def test_n_choices_each_generated_and_prompt_counted_once(sim_server: Server) -> None:
    result = client(sim_server).completions.create(
        model=model_of(sim_server), prompt=[1, 2, 3], max_tokens=4, n=3
    )
    assert [choice.index for choice in result.choices] == [0, 1, 2]
    assert all(choice.finish_reason == "length" for choice in result.choices)
    assert result.usage.prompt_tokens == 3  # the prompt once, as OpenAI counts it
    assert result.usage.completion_tokens == 3 * 4


def test_a_prompt_list_gets_n_choices_per_prompt(sim_server: Server) -> None:
    result = client(sim_server).completions.create(
        model=model_of(sim_server), prompt=[[1, 2], [3, 4, 5]], max_tokens=2, n=2
    )
    assert [choice.index for choice in result.choices] == [0, 1, 2, 3]
    assert result.usage.prompt_tokens == 2 + 3
    assert result.usage.completion_tokens == 4 * 2


def test_chat_n_choices_stream_with_their_index_and_one_usage(sim_server: Server) -> None:
    stream = client(sim_server).chat.completions.create(
        model=model_of(sim_server),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    text: dict[int, str] = {0: "", 1: ""}
    finished: dict[int, str] = {}
    usages = []
    ids = set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finished[choice.index] = choice.finish_reason
    assert len(ids) == 1  # one answer
    assert finished == {0: "length", 1: "length"}
    assert text[0] and text[0] == text[1]  # the simulator's placeholder text
    assert len(usages) == 1 and usages[0].completion_tokens == 2 * 3


def test_a_real_models_choices_follow_their_prompt_and_seed(tiny_server: Server) -> None:
    c = client(tiny_server)

    def one(prompt: str, **fields: object) -> str:
        result = c.completions.create(model="builtin:tiny", prompt=prompt, max_tokens=6, **fields)
        return result.choices[0].text

    batch = c.completions.create(
        model="builtin:tiny", prompt=["Hello", "World"], max_tokens=6, n=2, temperature=0
    )
    hello, world = one("Hello", temperature=0), one("World", temperature=0)
    assert [choice.text for choice in batch.choices] == [hello, hello, world, world]
    # Seeded choices are seeded seed, seed + 1, ...: each reproducible, not all alike.
    seeded = c.completions.create(
        model="builtin:tiny", prompt="Hello", max_tokens=6, n=2, temperature=1.0, seed=5
    )
    assert [choice.text for choice in seeded.choices] == [
        one("Hello", temperature=1.0, seed=5),
        one("Hello", temperature=1.0, seed=6),
    ]


def test_logit_bias_and_penalties_change_a_real_models_text(tiny_server: Server) -> None:
    c = client(tiny_server)
    fields = {"model": "builtin:tiny", "prompt": "Hello", "max_tokens": 16, "temperature": 0}
    plain = c.completions.create(**fields, logprobs=0)
    # A bias of 100 on one token makes it every greedy token (logprobs stay the model's).
    biased = c.completions.create(**fields, logprobs=0, logit_bias={"7": 100})
    assert len(set(biased.choices[0].logprobs.tokens)) == 1
    assert biased.choices[0].text != plain.choices[0].text
    # Penalties on a greedy text that repeats itself (a random model's does) change it.
    tokens = plain.choices[0].logprobs.tokens
    assert len(set(tokens)) < len(tokens)
    for penalty in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        assert c.completions.create(**fields, **penalty).choices[0].text != plain.choices[0].text
    repeated = c.completions.create(**fields, extra_body={"repetition_penalty": 10.0})
    assert repeated.choices[0].text != plain.choices[0].text
    off = c.completions.create(
        **fields, frequency_penalty=0, presence_penalty=0, extra_body={"top_k": -1}
    )
    assert off.choices[0].text == plain.choices[0].text  # the "off" values change nothing


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "response_format", {"type": "json_object"}),
        ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
        ("/v1/chat/completions", "tool_choice", "required"),
        ("/v1/completions", "echo", True),
        ("/v1/completions", "suffix", "end"),
        ("/v1/completions", "guided_json", {"type": "object"}),
        ("/v1/completions", "use_beam_search", True),
        ("/v1/completions", "min_tokens", 3),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(
    sim_server: Server, path: str, field: str, value: object
) -> None:
    body: dict[str, object] = {"model": model_of(sim_server), "max_tokens": 2, field: value}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    answer = httpx.post(sim_server.url + path, json=body, headers=sim_server.headers(), timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == field and "not supported" in error["message"]


def test_the_off_values_of_refused_fields_are_accepted(sim_server: Server) -> None:
    c = client(sim_server)
    chat = c.chat.completions.create(
        model=model_of(sim_server),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        response_format={"type": "text"},
        tool_choice="none",
        extra_body={"tools": []},
    )
    assert chat.choices[0].finish_reason == "length"
    completion = c.completions.create(
        model=model_of(sim_server), prompt="hi", max_tokens=2, echo=False, best_of=1
    )
    assert completion.usage.completion_tokens == 2


def test_too_many_choices_are_refused_before_any_runs(sim_server: Server) -> None:
    c = client(sim_server)
    with pytest.raises(openai.BadRequestError) as caught:
        c.completions.create(model=model_of(sim_server), prompt=["a"] * 20, n=10, max_tokens=2)
    assert caught.value.body["param"] == "n"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as best_of:
        c.completions.create(model=model_of(sim_server), prompt="a", n=2, best_of=4)
    assert best_of.value.body["param"] == "best_of"  # type: ignore[index]


def test_a_request_refused_for_its_last_choice_takes_no_rpm_place(server_dir) -> None:  # type: ignore[no-untyped-def]
    """n choices take n places in the tenant's rpm window; when a later one is refused,
    the request is refused whole and gives back the places its first choices took."""
    from tests.server.conftest import launch
    from tokenfair.edge.tenants import hash_key

    tenants = {"tenants": [{"name": "capped", "key_sha256": [hash_key("key-capped")], "rpm": 3}]}
    server = launch(server_dir, "--model", "sim:zero", tenants=tenants)
    try:
        capped = openai.OpenAI(base_url=server.url + "/v1", api_key="key-capped", max_retries=0)
        model = capped.models.list().data[0].id
        assert (
            len(capped.completions.create(model=model, prompt="a", max_tokens=1, n=2).choices) == 2
        )
        with pytest.raises(openai.RateLimitError):  # its 2nd choice would be the 4th place
            capped.completions.create(model=model, prompt="a", max_tokens=1, n=2)
        # One place is left, not zero: the refused request took none.
        assert len(capped.completions.create(model=model, prompt="a", max_tokens=1).choices) == 1
        with pytest.raises(openai.RateLimitError):
            capped.completions.create(model=model, prompt="a", max_tokens=1)
    finally:
        server.stop()
