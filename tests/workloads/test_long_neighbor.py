"""The long-context-neighbour workload: its shapes, and the chat traffic alone."""

from __future__ import annotations

from tokenfair.workloads.long_neighbor import A10G_CASE, H200_CASE, LONG_CLIENT
from tokenfair.workloads.suites import generate_suite, generate_workload


def test_the_chat_traffic_alone_is_the_same_requests_as_beside_the_long_tenant() -> None:
    both = generate_workload(A10G_CASE.client_specs(), A10G_CASE.duration_s, 3).records
    alone = generate_workload(A10G_CASE.client_specs(with_long=False), A10G_CASE.duration_s, 3)
    chat = [
        (r.arrival_s, r.client, r.input_tokens, r.output_tokens)
        for r in both
        if r.client != LONG_CLIENT
    ]
    assert chat == [(r.arrival_s, r.client, r.input_tokens, r.output_tokens) for r in alone.records]
    assert any(r.client == LONG_CLIENT for r in both)


def test_the_suites_have_the_shapes_they_describe() -> None:
    for name, spec in (("long-neighbor", A10G_CASE), ("long-neighbor-h200", H200_CASE)):
        records = generate_suite(name, seed=0).records
        long = [r for r in records if r.client == LONG_CLIENT]
        chat = [r for r in records if r.client != LONG_CLIENT]
        assert all(spec.long_prompt[0] <= r.input_tokens <= spec.long_prompt[1] for r in long)
        assert all(spec.chat_prompt[0] <= r.input_tokens <= spec.chat_prompt[1] for r in chat)
        rate = len(long) / spec.duration_s
        assert 0.7 * spec.long_rate < rate < 1.3 * spec.long_rate
