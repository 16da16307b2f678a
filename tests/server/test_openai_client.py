"""The official openai client, sync and async, streaming and not, against sim: and builtin:tiny."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.server.conftest import KEYS, Server


def client(server: Server, tenant: str = "team-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[tenant], max_retries=0)


def async_client(server: Server, tenant: str = "team-a") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS[tenant], max_retries=0)


def model_of(server: Server) -> str:
    return client(server).models.list().data[0].id


@pytest.fixture(params=["sim", "tiny"])
def any_server(request: pytest.FixtureRequest) -> Server:
    return request.getfixturevalue(f"{request.param}_server")


def test_models_lists_the_served_model(sim_server):
    models = client(sim_server).models.list().data
    assert [m.id for m in models] == ["sim:fixed:0.002"]


def test_a_model_is_retrieved_by_id(sim_server):
    c = client(sim_server)
    name = model_of(sim_server)
    assert c.models.retrieve(name).id == name  # the id holds a colon: sim:fixed:0.002
    with pytest.raises(openai.NotFoundError) as caught:
        c.models.retrieve("org/other-model")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_completion_sync(any_server):
    c = client(any_server)
    result = c.completions.create(
        model=model_of(any_server), prompt="Hello", max_tokens=7, temperature=0
    )
    choice = result.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert result.usage is not None
    assert result.usage.completion_tokens <= 7
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens
    if choice.finish_reason == "length":
        assert result.usage.completion_tokens == 7


def test_sim_generates_exactly_max_tokens(sim_server):
    result = client(sim_server).completions.create(
        model=model_of(sim_server), prompt="Hi there", max_tokens=9
    )
    assert result.usage.completion_tokens == 9
    assert result.choices[0].text == " tok" * 9
    assert result.choices[0].finish_reason == "length"
    assert result.usage.prompt_tokens == 2  # 8 bytes, 4 bytes a token


def test_completion_stream_sync_with_usage(any_server):
    c = client(any_server)
    stream = c.completions.create(
        model=model_of(any_server),
        prompt="Hello",
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    reasons = [
        ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason
    ]
    assert reasons and reasons[-1] in ("length", "stop")
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens <= 6
    whole = c.completions.create(
        model=model_of(any_server), prompt="Hello", max_tokens=6, temperature=0
    )
    assert whole.choices[0].text == text  # greedy: streamed == whole


def test_chat_sync_and_stream(any_server):
    c = client(any_server)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    whole = c.chat.completions.create(
        model=model_of(any_server), messages=messages, max_tokens=5, temperature=0
    )
    assert whole.choices[0].message.role == "assistant"
    assert whole.object == "chat.completion"
    deltas = list(
        c.chat.completions.create(
            model=model_of(any_server),
            messages=messages,
            max_completion_tokens=5,
            temperature=0,
            stream=True,
        )
    )
    assert deltas[0].choices[0].delta.role == "assistant"
    streamed = "".join(d.choices[0].delta.content or "" for d in deltas if d.choices)
    assert streamed == whole.choices[0].message.content


def test_async_client_concurrent_streams(any_server):
    async def main() -> list[str]:
        c = async_client(any_server)
        name = (await c.models.list()).data[0].id

        async def one(i: int) -> str:
            stream = await c.completions.create(
                model=name, prompt=f"prompt {i}", max_tokens=4, temperature=0, stream=True
            )
            return "".join([ch.choices[0].text async for ch in stream if ch.choices])

        async def whole(i: int) -> str:
            r = await c.completions.create(
                model=name, prompt=f"prompt {i}", max_tokens=4, temperature=0
            )
            return r.choices[0].text

        streamed = await asyncio.gather(*(one(i) for i in range(8)))
        wholes = await asyncio.gather(*(whole(i) for i in range(8)))
        await c.close()
        assert streamed == wholes
        return streamed

    assert len(asyncio.run(main())) == 8


def test_errors_come_in_openai_shape(sim_server):
    c = client(sim_server)
    name = model_of(sim_server)
    with pytest.raises(openai.BadRequestError) as caught:
        c.completions.create(model=name, prompt="x", extra_body={"echo": True})
    assert caught.value.body["param"] == "echo"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-17", prompt="x")
    bad = openai.OpenAI(base_url=f"{sim_server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad.completions.create(model=name, prompt="x")
    assert auth.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    raw = httpx.post(
        f"{sim_server.url}/v1/completions", content=b"{not json", headers=sim_server.headers()
    )
    assert raw.status_code == 400
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_fields_users_send_are_accepted(sim_server):
    c = client(sim_server)
    result = c.completions.create(
        model=model_of(sim_server),
        prompt=[1, 2, 3],
        max_tokens=3,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        stop=["\n\n"],
        user="someone",
        extra_body={"priority": -1, "unknown_field": {"ignored": True}},
    )
    assert result.usage.prompt_tokens == 3
    assert result.usage.completion_tokens == 3


def test_stop_string_ends_the_request(sim_server):
    # Placeholder text is " tok tok ...": stopping at "tok tok" leaves " " before it.
    result = client(sim_server).completions.create(
        model=model_of(sim_server), prompt="x", max_tokens=50, stop=["tok tok"]
    )
    assert result.choices[0].finish_reason == "stop"
    assert result.choices[0].text == " "
    assert result.usage.completion_tokens == 2  # ended in the step the stop appeared


def test_logprobs_on_a_real_model(tiny_server):
    c = client(tiny_server)
    result = c.completions.create(
        model="builtin:tiny", prompt="Hello", max_tokens=5, temperature=0, logprobs=2
    )
    lp = result.choices[0].logprobs
    assert lp is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == result.usage.completion_tokens
    assert all(len(top) <= 3 for top in lp.top_logprobs)  # the sampled token + the top 2
    assert all(v <= 0 for v in lp.token_logprobs)
    chat = c.chat.completions.create(
        model="builtin:tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=1,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(entry.top_logprobs) <= 1 for entry in content)
