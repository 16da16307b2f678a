"""The A10G profile against the paper's measured FCFS run of the arena trace.

Replays ../shared/traces/arena_vtc_600s.jsonl under FCFS with the paper preset (10,000
token pool, reserve admission) and compares with
../shared/reference/a10g_llama7b_fcfs_arena_measured.jsonl: makespan (measured 757.7 s),
throughput (measured 777 tok/s), and the median / p90 absolute error of per-request
TTFT and latency. Prints one JSON line.

    python benchmarks/validate_a10g.py [--shared ../shared]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.engine.sim.validation import compare_with_measured
from tokenfair.fairness.metrics import throughput
from tokenfair.measured import read_measured_reference
from tokenfair.workloads.trace import read_trace

MEASURED_MAKESPAN_S = 757.7
MEASURED_THROUGHPUT = 777.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared"
    )
    args = parser.parse_args()
    trace = read_trace(args.shared / "traces" / "arena_vtc_600s.jsonl")
    measured = read_measured_reference(
        args.shared / "reference" / "a10g_llama7b_fcfs_arena_measured.jsonl"
    )
    profile = load_profile("a10g-llama-7b")
    figures: dict[str, object] = {"benchmark": "validate_a10g"}
    runs = {}
    for policy in ("fcfs", "vtc"):
        runs[policy] = simulate(trace, make_policy(policy), profile, SchedulerConfig.paper())
    report = compare_with_measured(runs["fcfs"].results, measured, MEASURED_MAKESPAN_S)
    figures.update({k: round(v, 4) for k, v in report.items()})
    fcfs_tput = throughput(runs["fcfs"].results)
    vtc_tput = throughput(runs["vtc"].results)
    figures["throughput_tok_s"] = round(fcfs_tput, 1)
    figures["throughput_error"] = round(fcfs_tput / MEASURED_THROUGHPUT - 1, 4)
    figures["vtc_throughput_tok_s"] = round(vtc_tput, 1)
    figures["vtc_over_fcfs_throughput"] = round(vtc_tput / fcfs_tput, 4)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
