"""A long-context neighbour: what a tenant flooding long prompts does to light tenants.

The experiment of tokenfair/experiments/neighbor.py (the paper report's section "A
long-context neighbour"), on more seeds and, with `--variants`, on variants of the two
cases: other rates, 100k-token prompts, and 48k-64k-token prompts overloading a pool
that holds two of them (where the memory victims show). For each case: the chat
traffic alone, `fcfs`, `vtc` and `vtc-preempt` with memory and step not shared, `vtc`
with the defaults (shared), and the default at several step shares (the trade); with
`--variants`, `vtc-preempt` with the defaults too. Prints one JSON line: per case and
run, the chat tenants' TTFT p50/p99 and TPOT p50 (and their ratios to alone), the long
tenant's throughput (and its ratio to fcfs's), and the chat requests preempted.

    python benchmarks/long_neighbor.py [--seeds 0,1,2] [--variants] [--figure out.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from tokenfair.experiments.neighbor import (
    CASES,
    RUNS,
    SWEEP,
    VARIANT_CASES,
    neighbor_jobs,
    neighbor_rows,
)
from tokenfair.experiments.runner import run_jobs
from tokenfair.report.neighbor_report import plot_step_share

PREEMPT_SHARED = ("vtc-preempt (holdings shared)", "vtc-preempt", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", action="store_true", help="run the variant cases too")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--figure", type=Path, help="write the step-share trade figure here")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = neighbor_jobs(seeds, RUNS + SWEEP, CASES)
    if args.variants:
        jobs += neighbor_jobs(seeds, (*RUNS, PREEMPT_SHARED), VARIANT_CASES)
    rows = neighbor_rows(run_jobs(jobs, args.workers))
    if args.figure:
        with tempfile.TemporaryDirectory() as folder:
            written = plot_step_share(rows, Path(folder))
            if written:
                args.figure.write_bytes((Path(folder) / written).read_bytes())
    json.dump({"seeds": seeds, "rows": [asdict(row) for row in rows]}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
