"""docs/experiments.md's tables of measured numbers, rendered from a paper run's
metrics.json, so that the docs say what the code measures (a test renders them from
its own run and finds them in the docs).

    python -m tokenfair.report.docs_tables out/paper-full/metrics.json

prints the arena table and the synthetic suites' table, to paste over the docs' own.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenfair.experiments.experiment import PAPER_POLICIES, WEIGHTED_POLICY, WEIGHTED_SUITE
from tokenfair.experiments.paper_table import PAPER_ARENA_TABLE
from tokenfair.experiments.workloads import ARENA, PAPER_SUITES

Run = dict[str, Any]  # a row of metrics.json's `runs`

ARENA_HEADER = (
    "| scheduler | Max Diff | Avg Diff | Diff Var | Throughput (tok/s) | Max Diff ÷ FCFS "
    "| paper Max Diff | paper ÷ FCFS |\n|---|---|---|---|---|---|---|---|"
)
SUITES_HEADER = (
    "| suite | FCFS Max / Avg Diff | VTC Max / Avg Diff | VTC ÷ FCFS (Max) |\n|---|---|---|---|"
)
# The paper measured its VTC row with the artifact's queue; `vtc-preempt` is ours.
PAPER_ROW_OF = {"vtc-artifact": ("vtc", " (VTC)")}


def _run(runs: Sequence[Run], workload: str, policy: str) -> Run:
    found = [r for r in runs if r["workload"] == workload and r["policy"] == policy]
    if not found:
        raise ValueError(f"metrics.json has no run of {policy!r} on {workload!r}")
    return found[0]


def arena_table(runs: Sequence[Run]) -> str:
    """The arena table: ours beside the paper's measured one."""
    fcfs = _run(runs, ARENA, "fcfs")["max_diff"]
    paper_fcfs = PAPER_ARENA_TABLE["fcfs"].max_diff
    lines = [ARENA_HEADER]
    for policy in PAPER_POLICIES:
        run = _run(runs, ARENA, policy)
        key, note = PAPER_ROW_OF.get(policy, (policy, ""))
        paper = PAPER_ARENA_TABLE.get(key)
        if paper is None:
            theirs = "(not in the paper) |"
        else:
            theirs = f"{paper.max_diff:,.2f}{note} | {paper.max_diff / paper_fcfs:.3f}"
        lines.append(
            f"| {policy} | {run['max_diff']:,.2f} | {run['avg_diff']:,.2f} | "
            f"{run['diff_var']:,.2f} | {run['throughput_tok_s']:,.0f} | "
            f"{run['max_diff'] / fcfs:.3f} | {theirs} |"
        )
    return "\n".join(lines)


def suites_table(runs: Sequence[Run]) -> str:
    """Every synthetic suite: FCFS against VTC (weighted VTC on the weighted suite)."""
    lines = [SUITES_HEADER]
    for suite in PAPER_SUITES:
        weighted = suite == WEIGHTED_SUITE
        fcfs = _run(runs, suite, "fcfs")
        vtc = _run(runs, suite, WEIGHTED_POLICY if weighted else "vtc")
        name = f"{suite} ({WEIGHTED_POLICY})" if weighted else suite
        lines.append(
            f"| {name} | {fcfs['max_diff']:,.1f} / {fcfs['avg_diff']:,.1f} | "
            f"{vtc['max_diff']:,.1f} / {vtc['avg_diff']:,.1f} | "
            f"{vtc['max_diff'] / fcfs['max_diff']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tokenfair.report.docs_tables METRICS_JSON", file=sys.stderr)
        return 2
    runs = json.loads(Path(argv[0]).read_text())["runs"]
    print(arena_table(runs), suites_table(runs), sep="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
