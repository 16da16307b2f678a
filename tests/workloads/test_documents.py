"""The `documents` workload: clients asking questions about long documents."""

from __future__ import annotations

from collections import Counter

import pytest

from tokenfair.workloads.documents import DocumentsOptionError, DocumentsSpec
from tokenfair.workloads.lengths import UniformInt
from tokenfair.workloads.suites import documents_workload, generate_suite


def test_every_request_is_a_document_of_its_client_and_a_question() -> None:
    spec = DocumentsSpec(clients=3, documents_per_client=5, document_tokens=1000, duration_s=200)
    records = documents_workload(spec, seed=1).records
    assert {r.client for r in records} == {"client-0", "client-1", "client-2"}
    for r in records:
        assert r.prefix_group is not None and r.prefix_group.startswith(r.client + "/doc-")
        assert r.prefix_tokens == 1000
        assert 50 <= r.input_tokens - 1000 <= 150
        assert 100 <= r.output_tokens <= 300
    groups = {r.prefix_group for r in records}
    assert len(groups) == spec.distinct_documents == 15
    assert spec.footprint_tokens == 15_000
    # client-0 is the busiest: 2.5x the others' rate.
    counts = Counter(r.client for r in records)
    assert counts["client-0"] / counts["client-1"] == pytest.approx(2.5, rel=0.2)
    assert [r.arrival_s for r in records] == sorted(r.arrival_s for r in records)
    assert max(r.arrival_s for r in records) < 200


def test_skew_makes_the_first_document_the_most_asked() -> None:
    skewed = documents_workload(DocumentsSpec(skew=1.0, duration_s=600), seed=2).records
    for client in ("client-0", "client-3"):
        asked = Counter(r.prefix_group for r in skewed if r.client == client)
        ranked = [asked[f"{client}/doc-{k}"] for k in range(4)]
        assert ranked[0] == max(ranked) and ranked[0] > 1.5 * ranked[3]
    uniform = documents_workload(DocumentsSpec(skew=0.0, duration_s=600), seed=2).records
    asked = Counter(r.prefix_group for r in uniform if r.client == "client-0")
    assert max(asked.values()) < 1.4 * min(asked.values())


def test_shared_documents_are_one_group_across_clients() -> None:
    spec = DocumentsSpec(clients=4, documents_per_client=3, shared_documents=2, skew=1.0)
    records = documents_workload(spec, seed=0).records
    readers: dict[str, set[str]] = {}
    for r in records:
        assert r.prefix_group is not None
        readers.setdefault(r.prefix_group, set()).add(r.client)
    shared = {g for g in readers if g.startswith("shared/")}
    assert shared == {"shared/doc-0", "shared/doc-1"}
    assert all(readers[g] == {f"client-{i}" for i in range(4)} for g in shared)
    own = set(readers) - shared
    assert all(len(readers[g]) == 1 and g.startswith(next(iter(readers[g]))) for g in own)
    assert len(readers) == spec.distinct_documents == 2 + 4 * 1
    assert spec.documents_of(1) == ("shared/doc-0", "shared/doc-1", "client-1/doc-0")


def test_deterministic_for_a_seed_and_the_named_suite_is_the_default() -> None:
    spec = DocumentsSpec(question=UniformInt(10, 20), duration_s=60)
    assert documents_workload(spec, seed=5).records == documents_workload(spec, seed=5).records
    assert documents_workload(spec, seed=5).records != documents_workload(spec, seed=6).records
    assert generate_suite("documents", seed=3).records == documents_workload(seed=3).records


@pytest.mark.parametrize(
    ("values", "option"),
    [
        ({"clients": 0}, "clients"),
        ({"documents_per_client": 0}, "documents_per_client"),
        ({"document_tokens": 2.5}, "document_tokens"),
        ({"skew": -1.0}, "skew"),
        ({"busy_factor": 0.0}, "busy_factor"),
        ({"rate": float("inf")}, "rate"),
        ({"duration_s": 0.0}, "duration_s"),
        ({"shared_documents": -1}, "shared_documents"),
        ({"shared_documents": 5}, "shared_documents"),
    ],
)
def test_bad_options_are_refused_naming_the_option(values: dict, option: str) -> None:
    with pytest.raises(DocumentsOptionError, match=f"^{option} must") as caught:
        DocumentsSpec(**values)
    assert caught.value.option == option
