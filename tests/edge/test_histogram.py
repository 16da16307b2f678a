"""The loop histogram exposes exactly what prometheus_client's Histogram would."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tokenfair.edge.histogram import LoopHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "team-c"]),
            st.one_of(st.sampled_from(BUCKETS), st.floats(0, 50, allow_nan=False)),
        ),
        max_size=60,
    )
)
def test_same_series_as_prometheus_client(observations):
    reference_registry, loop_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram(
        "x_seconds", "doc", ["tenant"], buckets=BUCKETS, registry=reference_registry
    )
    loop = LoopHistogram("x_seconds", "doc", "tenant", BUCKETS)
    loop_registry.register(loop)
    for tenant, value in observations:  # values on a bound land in that bound's bucket
        reference.labels(tenant).observe(value)
        loop.labels(tenant).observe(value)
    expected, got = samples(reference_registry), samples(loop_registry)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


def test_buckets_must_increase():
    with pytest.raises(ValueError, match="increase"):
        LoopHistogram("y", "doc", "tenant", (0.1, 0.1, 1.0))
    with pytest.raises(ValueError, match="increase"):
        LoopHistogram("y", "doc", "tenant", (1.0, 0.1))


def test_many_observations_count_and_sum():
    loop = LoopHistogram("z", "doc", "tenant", BUCKETS)
    rng = random.Random(1)
    values = [rng.expovariate(10) for _ in range(10_000)]
    for value in values:
        loop.labels("a").observe(value)
    series = loop.labels("a")
    assert sum(series.counts) == len(values)
    assert series.sum == pytest.approx(sum(values))
    assert series.counts[0] == sum(v <= 0.001 for v in values)
