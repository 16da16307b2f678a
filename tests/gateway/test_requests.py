"""What the gateway reads of a request body, and that what it forwards is what was sent."""

from __future__ import annotations

import json

import pytest

from tokenfair.edge.errors import APIError
from tokenfair.gateway.transport.requests import parse_call


def test_a_body_that_needs_no_change_is_forwarded_byte_for_byte() -> None:
    raw = b'{"model": "m",  "prompt": "x", "seed": 123456789012345678901234567890, "n": 2}'
    assert parse_call(raw, "completions").body == raw


@pytest.mark.parametrize(
    "extra",
    [
        b'"seed": 123456789012345678901234567890',  # beyond 64 bits: orjson would make a float
        b'"temperature": NaN',  # refused by orjson, taken by Python-based engines
        b'"prompt_suffix": "\\ud800"',  # a lone surrogate, as an escape
    ],
)
def test_a_rewritten_stream_body_keeps_every_value_as_sent(extra: bytes) -> None:
    raw = b'{"model": "m", "prompt": "x", "stream": true, ' + extra + b"}"
    call = parse_call(raw, "completions")
    assert call.stream and not call.client_wants_usage
    sent, forwarded = json.loads(raw), json.loads(call.body)
    assert forwarded.pop("stream_options") == {"include_usage": True}
    assert repr(forwarded) == repr(sent)  # repr: NaN != NaN, and ints stay ints
    assert extra.split(b": ")[1] in call.body


def test_a_body_that_is_not_json_is_a_400() -> None:
    for raw in (b"{not json", b"[" * 100_000):
        with pytest.raises(APIError) as raised:
            parse_call(raw, "completions")
        assert raised.value.status_code == 400


@pytest.mark.parametrize(
    ("body", "choices"),
    [
        ({"prompt": "x"}, 1),
        ({"prompt": "x", "n": 3}, 3),
        ({"prompt": [1, 2, 3], "n": 2}, 2),  # one prompt of token ids
        ({"prompt": ["a", "b"], "n": 2}, 4),
        ({"prompt": [[1], [2], [3]]}, 3),
        ({"prompt": "x", "n": None}, 1),
    ],
)
def test_the_gateway_reserves_output_for_every_choice(body: dict, choices: int) -> None:
    """n per prompt, and a completions prompt may be a list of prompts: the upstream
    generates max_tokens for each, so the gateway's reservation counts them all."""
    call = parse_call(json.dumps({"model": "m", **body}).encode(), "completions")
    assert call.choices == choices


def test_n_must_be_a_positive_integer() -> None:
    for n in (0, "2", 1.5):
        with pytest.raises(APIError) as raised:
            parse_call(json.dumps({"model": "m", "prompt": "x", "n": n}).encode(), "completions")
        assert raised.value.param == "n"
