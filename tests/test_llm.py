"""The offline `LLM` API and the `tokenfair generate` helper, on builtin:tiny."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model

torch = pytest.importorskip("torch")

from tokenfair.core.request import SamplingParams  # noqa: E402
from tokenfair.llm import LLM, generate_command  # noqa: E402


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("builtin:tiny", device="cpu", kv_tokens=8192, max_num_seqs=8)


def test_greedy_completions_match_transformers_generate(llm):
    prompts = ["Hello", "A longer prompt, to mix lengths in one batch.", "x" * 200, "é"]
    completions = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert [c.prompt for c in completions] == prompts
    model = llm.loaded.model
    for completion in completions:
        ids = torch.tensor([completion.prompt_token_ids])
        expected = model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        assert completion.token_ids == expected[0, ids.shape[1] :].tolist()
        assert completion.text == llm.tokenizer.decode(completion.token_ids)
        assert completion.finish_reason == "length"


def test_per_prompt_sampling_params_seeds_and_logprobs(llm):
    params = [
        SamplingParams(max_tokens=10, temperature=0.9, seed=5, logprobs=2),
        SamplingParams(max_tokens=3),
    ]
    first = llm.generate(["a", "b"], params)
    second = llm.generate(["a", "b"], params)
    assert first[0].token_ids == second[0].token_ids
    assert len(first[0].logprobs) == 10 and first[1].logprobs is None
    assert len(first[1].token_ids) == 3


def test_token_id_prompts_and_chat(llm):
    (completion,) = llm.generate([[256, 72, 105]], SamplingParams(max_tokens=4))
    assert completion.prompt_token_ids == [256, 72, 105]
    reply = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=6))
    assert len(reply.token_ids) <= 6 and isinstance(reply.text, str)


def test_too_long_request_is_an_error_not_a_hang():
    small = LLM("builtin:tiny", device="cpu", kv_tokens=64, block_size=16)
    with pytest.raises(ValueError, match="kv_tokens"):
        small.generate("hello", SamplingParams(max_tokens=100))


def test_generate_command_streams_the_completion(llm):
    pieces = list(generate_command("builtin:tiny", "Hello", max_tokens=12, temperature=0.0))
    text = "".join(pieces)
    assert all(isinstance(p, str) and p for p in pieces)
    assert 0 < len(text) <= 12
    assert len(pieces) > 1  # piece by piece, not the whole text at the end
    sampling = SamplingParams(max_tokens=12)
    assert text == llm.generate("Hello", sampling)[0].text
    assert "".join(llm.stream("Hello", sampling)) == text


def test_abandoned_stream_aborts_its_request(llm):
    stream = llm.stream("Hello", SamplingParams(max_tokens=50, ignore_eos=True))
    next(stream)
    stream.close()
    assert not llm.engine.has_unfinished()


def test_generate_command_line_prints_the_streamed_text(llm):
    from typer.testing import CliRunner

    from tokenfair.cli import app

    result = CliRunner().invoke(
        app, ["generate", "--prompt", "Hello", "--max-tokens", "12", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    expected = llm.generate("Hello", SamplingParams(max_tokens=12))[0].text
    assert result.stdout == expected + "\n"
