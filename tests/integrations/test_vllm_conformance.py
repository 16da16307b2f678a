"""The conformance run's own logic (tests/integrations/vllm_conformance), without vLLM:
how it judges four passes, and that docs/vllm.md lists what it expects to differ."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "vllm_conformance"))

import expected  # noqa: E402
import run  # noqa: E402

ROOT = HERE.parents[1]
LISTED = next(iter(expected.VTC_DIFFERS))


def passes(outcomes: dict[str, str], policies: dict[str, list[str]] | None = None) -> dict:
    return {
        test: {"outcome": outcome, "policies": (policies or {}).get(test, ["fcfs"])}
        for test, outcome in outcomes.items()
    }


def results(**changes: dict[str, str]) -> dict:
    tests = {"f.py::test_a": "passed", "f.py::test_b[1]": "passed", "f.py::test_c": "failed"}
    tests[f"f.py::{LISTED}"] = "passed"
    tests["f.py::test_prio"] = "passed"
    prio = {"f.py::test_prio": ["priority"]}
    out = {"stock": passes(tests, prio)}
    for mode in ("fcfs", "priority", "vtc"):
        # By default vtc differs where it is listed to, and nowhere else.
        default = {f"f.py::{LISTED}": "failed"} if mode == "vtc" else {}
        out[mode] = passes({**tests, **default, **changes.get(mode, {})}, prio)
    return out


def test_all_passing_is_clean_and_counted():
    figures, problems = run.compare(results(fcfs={"f.py::test_prio": "failed"}))
    assert problems == []
    assert figures["stock_passed"] == 4 and figures["not_runnable_here"] == 1
    assert figures["fcfs"] == {
        "passed_of_stock_passed": 3,
        "differ_as_documented": 1,
        "unexplained": 0,
    }
    assert figures["vtc"]["differ_as_documented"] == 1


@pytest.mark.parametrize(
    ("mode", "test"),
    [
        ("fcfs", "f.py::test_a"),
        ("priority", "f.py::test_prio"),  # priority tests must pass under `priority`
        ("priority", "f.py::test_b[1]"),
        ("vtc", "f.py::test_a"),  # not listed
    ],
)
def test_a_new_failure_is_unexplained(mode, test):
    figures, problems = run.compare(results(**{mode: {test: "failed"}}))
    assert figures[mode]["unexplained"] == 1
    assert len(problems) == 1 and problems[0].startswith(f"{mode}: {test} passes on stock")


def test_a_listed_test_that_passes_makes_the_list_stale():
    _, problems = run.compare(results(vtc={f"f.py::{LISTED}": "passed"}))
    assert problems == [f"vtc: {LISTED} is listed as differing but passes"]


def test_a_test_that_fails_on_stock_is_left_out():
    _, problems = run.compare(results(fcfs={"f.py::test_c": "failed"}, vtc={"f.py::test_c": "x"}))
    assert problems == []


def test_docs_list_the_tests_vtc_is_expected_to_differ_on():
    text = (ROOT / "docs" / "vllm.md").read_text()
    table = re.search(r"<!-- vtc-differs: start -->(.*?)<!-- vtc-differs: end -->", text, re.S)
    assert table is not None
    documented = re.findall(r"^\| `(test_[a-z0-9_]+)` \| (.+) \|$", table.group(1), re.M)
    assert [name for name, _ in documented] == list(expected.VTC_DIFFERS)
    assert all(reason.strip() for _, reason in documented)
