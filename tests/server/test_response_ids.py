"""A response's id says nothing of the other tenants' requests."""

from __future__ import annotations

import itertools

from tokenfair.server.state import new_response_id


def test_response_ids_are_random_not_a_count_of_requests() -> None:
    ids = [new_response_id("chatcmpl") for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    values = [int(i.removeprefix("chatcmpl-"), 16) for i in ids]
    # A counter (even behind a random prefix) makes successive ids differ by one.
    steps = {b - a for a, b in itertools.pairwise(values)}
    assert 1 not in steps and len(steps) == len(values) - 1
    assert all(len(i) == len("chatcmpl-") + 24 for i in ids)  # 96 random bits
