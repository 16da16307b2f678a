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


def test_a_run_that_runs_too_little_of_vllms_tests_fails():
    # 4 of 5 run here (80%); one more that cannot run puts it at 4 of 6 (67%).
    figures, problems = run.compare(results())
    assert figures["runnable_share"] == 0.8 and problems == []
    few = results()
    for mode in few:
        few[mode]["f.py::test_d"] = {"outcome": "skipped", "policies": ["fcfs"]}
    figures, problems = run.compare(few)
    assert figures["runnable_share"] == 0.667
    assert problems == [
        "stock: only 4 of the 6 tests run here (67%), below the floor of 75%: "
        "the comparison would say little"
    ]


def test_a_pass_that_ran_nothing_fails_every_test():
    empty = results()
    empty["priority"] = {}
    figures, problems = run.compare(empty)
    assert figures["priority"]["unexplained"] == 4
    assert all("not run in this pass" in problem for problem in problems)


def test_a_test_that_fails_on_stock_is_left_out():
    _, problems = run.compare(results(fcfs={"f.py::test_c": "failed"}, vtc={"f.py::test_c": "x"}))
    assert problems == []


@pytest.mark.parametrize(
    ("mode", "listed"), [("vtc", expected.VTC_DIFFERS), ("priority", expected.PRIORITY_DIFFERS)]
)
def test_docs_list_the_tests_each_mode_is_expected_to_differ_on(mode, listed):
    text = (ROOT / "docs" / "vllm.md").read_text()
    pattern = rf"<!-- {mode}-differs: start -->(.*?)<!-- {mode}-differs: end -->"
    table = re.search(pattern, text, re.S)
    assert table is not None
    documented = re.findall(r"^\| `(test_[a-z0-9_]+)` \| (.+) \|$", table.group(1), re.M)
    assert [name for name, _ in documented] == list(listed)
    assert all(reason.strip() for _, reason in documented)


def test_a_listed_priority_difference_is_explained():
    name = next(iter(expected.PRIORITY_DIFFERS))
    outcomes = results(priority={f"f.py::{name}": "failed"})
    for mode in outcomes:
        outcomes[mode].setdefault(f"f.py::{name}", {"outcome": "passed", "policies": ["fcfs"]})
    outcomes["stock"][f"f.py::{name}"] = {"outcome": "passed", "policies": ["fcfs"]}
    figures, problems = run.compare(outcomes)
    assert problems == [] and figures["priority"]["differ_as_documented"] == 1
