"""Per-request sampling: seeds, top-k/top-p, logprobs, and stop strings."""

from __future__ import annotations

import pytest

from tokenfair.core.request import Request, SamplingParams

from .hf_models import engine_for, random_prompt

pytestmark = pytest.mark.model

torch = pytest.importorskip("torch")


def sampled_request(rid: str, prompt: list[int], **params) -> Request:
    sampling = SamplingParams(ignore_eos=True, **params)
    return Request(rid, "c", len(prompt), 0.0, sampling, prompt_token_ids=prompt)


def run(engine, requests) -> None:
    for request in requests:
        engine.add_request(request)
    engine.run_until_done(max_steps=2000)


def test_seeded_sampling_is_independent_of_batch_and_preemption():
    prompt = random_prompt(30, seed=1)
    params = dict(max_tokens=20, temperature=1.0, top_p=0.9, seed=42)
    alone = sampled_request("alone", prompt, **params)
    run(engine_for("llama"), [alone])

    engine = engine_for("llama")
    crowd = [
        sampled_request(f"o{i}", random_prompt(10 + i, seed=i), max_tokens=25, temperature=1.0)
        for i in range(4)
    ]
    again = sampled_request("again", prompt, **params)
    for request in [*crowd, again]:
        engine.add_request(request)
    for _ in range(5):
        engine.step()
    engine.scheduler.force_preempt("again", "recompute")
    engine.run_until_done(max_steps=2000)
    assert again.preemptions == 1
    assert again.output_token_ids == alone.output_token_ids

    other_seed = sampled_request("other", prompt, **{**params, "seed": 43})
    run(engine_for("llama"), [other_seed])
    assert other_seed.output_token_ids != alone.output_token_ids


def test_top_k_one_and_tiny_top_p_are_greedy():
    prompt = random_prompt(17, seed=2)
    greedy = sampled_request("g", prompt, max_tokens=15)
    top_k = sampled_request("k", prompt, max_tokens=15, temperature=1.5, top_k=1)
    top_p = sampled_request("p", prompt, max_tokens=15, temperature=1.5, top_p=1e-6)
    run(engine_for("gpt2"), [greedy, top_k, top_p])
    assert top_k.output_token_ids == greedy.output_token_ids
    assert top_p.output_token_ids == greedy.output_token_ids


def test_extreme_but_valid_parameters_are_greedy_and_never_fail():
    """What a client may send (temperature >= 0, 0 < top_p <= 1) at its edges: float32
    turns a temperature near 0 into infinities and a top_p near 0 into 0."""
    prompt = random_prompt(17, seed=3)
    greedy = sampled_request("g", prompt, max_tokens=8)
    edges = [
        sampled_request("t", prompt, max_tokens=8, temperature=1e-300),
        sampled_request("t6", prompt, max_tokens=8, temperature=1e-6),
        sampled_request("p", prompt, max_tokens=8, temperature=1.0, top_p=1e-300),
        sampled_request("tp", prompt, max_tokens=8, temperature=2.0, top_p=1e-45, top_k=3),
    ]
    run(engine_for("llama"), [greedy, *edges])
    for request in edges:
        assert request.output_token_ids == greedy.output_token_ids, request.request_id


def test_filter_logits_keeps_the_right_tokens():
    from tokenfair.engine.hf.sampler import filter_logits

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_k=2)).isfinite()
    assert kept.tolist() == [True, True, False, False]
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.8)).isfinite()
    assert kept.tolist() == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.81)).isfinite()
    assert kept.tolist() == [True, True, True, False]


def test_logprobs_are_returned_for_the_chosen_and_top_tokens():
    from tokenfair.engine.hf.executor import HFExecutor

    engine = engine_for("qwen2")
    executor: HFExecutor = engine.executor
    seen: dict[str, list] = {}
    execute = executor.execute

    def recording(batch):
        result = execute(batch)
        for rid, entries in (result.logprobs or {}).items():
            seen.setdefault(rid, []).extend(entries)
        return result

    executor.execute = recording
    request = sampled_request("lp", random_prompt(9, seed=3), max_tokens=5, logprobs=3)
    plain = sampled_request("plain", random_prompt(9, seed=4), max_tokens=5)
    run(engine, [request, plain])
    assert "plain" not in seen
    assert len(seen["lp"]) == 5
    for token, entry in zip(request.output_token_ids, seen["lp"], strict=True):
        assert token in entry and entry[token] <= 0
        assert max(entry.values()) == pytest.approx(entry[token])  # greedy picks the top one
        assert 3 <= len(entry) <= 4


def test_stop_string_ends_the_request_and_is_not_returned():
    from tokenfair.engine.hf.builtin import ByteTokenizer
    from tokenfair.engine.hf.factory import make_hf_engine
    from tokenfair.engine.hf.loader import load_model

    loaded = load_model("builtin:tiny", device="cpu")
    tokenizer = ByteTokenizer()
    prompt = tokenizer.chat_prompt([{"role": "user", "content": "stop here"}])
    free = sampled_request("free", prompt, max_tokens=40)
    run(make_hf_engine(loaded, kv_tokens=2048), [free])
    text = tokenizer.decode(free.output_token_ids)
    assert free.output_text == text
    stop = text[15:18]
    expected = text[: text.index(stop)]
    stopped = sampled_request("stopped", prompt, max_tokens=40, stop=(stop,))
    run(make_hf_engine(loaded, kv_tokens=2048), [stopped])
    assert stopped.finish_reason.value == "stop"
    assert stopped.output_text == expected


def _request(prompt: list[int], output: list[int], **params) -> Request:
    request = sampled_request("p", prompt, **params)
    request.extend_output(output)
    return request


@pytest.mark.parametrize(
    "params,output,prompt",
    [
        ({"presence_penalty": 2.0}, [5], [1]),  # 10 - 2 < 9
        ({"frequency_penalty": 0.6}, [5, 5], [1]),  # 10 - 1.2 < 9
        ({"repetition_penalty": 2.0}, [], [5]),  # a prompt token too: 10 / 2 < 9
        ({"logit_bias": ((7, 1.5),)}, [], [1]),  # 9 + 1.5 > 10
    ],
    ids=["presence", "frequency", "repetition", "logit_bias"],
)
def test_penalties_and_biases_move_the_greedy_choice(params, output, prompt):
    from tokenfair.engine.hf.sampler import Sampler

    logits = torch.full((1, 16), -1.0)
    logits[0, 5], logits[0, 7] = 10.0, 9.0
    plain = _request(prompt, output, max_tokens=4)
    tokens, _ = Sampler().sample(logits.clone(), [plain])
    assert tokens == [5]
    moved = _request(prompt, output, max_tokens=4, logprobs=0, **params)
    tokens, logprobs = Sampler().sample(logits.clone(), [moved])
    assert tokens == [7]
    # Logprobs are the model's own, before penalties (vLLM's default).
    assert logprobs is not None
    assert logprobs["p"][0][7] == pytest.approx(float(torch.log_softmax(logits[0], -1)[7]))


def test_repetition_penalty_multiplies_a_negative_logit():
    from tokenfair.engine.hf.sampler import penalize

    logits = torch.tensor([2.0, -2.0, 1.0])
    request = _request([0, 1], [], max_tokens=2, repetition_penalty=2.0)
    assert penalize(logits, request).tolist() == [1.0, -4.0, 1.0]


def test_min_p_drops_the_unlikely():
    from tokenfair.engine.hf.sampler import filter_logits

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filter_logits(logits, SamplingParams(temperature=1.0, min_p=0.2))
    assert torch.isfinite(kept).tolist() == [True, True, True, False]  # 0.05 < 0.2 x 0.5


def test_a_biased_token_is_every_greedy_token_of_a_real_model():
    prompt = random_prompt(12, seed=3)
    biased = sampled_request("b", prompt, max_tokens=6, logit_bias=((11, 100.0),))
    run(engine_for("llama"), [biased])
    assert biased.output_token_ids == [11] * 6
