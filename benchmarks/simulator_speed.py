"""Simulator speed: simulated tokens per wall second, on the arena trace and on a 10x
longer synthetic trace (the `arena-x10` suite). Prints one JSON line.

    python benchmarks/simulator_speed.py [--shared ../shared]

Side by side with another source tree (say `git worktree add /tmp/base HEAD`):

    python benchmarks/simulator_speed.py --baseline-src /tmp/base/src [--repeats 5]

runs every measurement in a fresh subprocess per tree (PYTHONPATH set to that tree's
src), alternating baseline and current, and prints each tree's median wall time and
the ratio current / baseline (below 1: the current tree is faster), with whether both
simulated the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.workloads.suites import generate_suite
from tokenfair.workloads.trace import read_trace


def measure(trace, policy: str) -> dict:
    started = time.perf_counter()
    result = simulate(
        trace, make_policy(policy), load_profile("a10g-llama-7b"), SchedulerConfig.paper()
    )
    wall = time.perf_counter() - started
    tokens = sum(r.input_tokens + r.output_tokens for r in result.results if r.finish_s is not None)
    return {
        "policy": policy,
        "requests": len(trace),
        "simulated_s": round(result.makespan_s, 1),
        "simulated_tokens": tokens,
        "wall_s": round(wall, 3),
        "simulated_tokens_per_wall_s": round(tokens / wall),
        "speedup_vs_real_time": round(result.makespan_s / wall, 1),
    }


POLICIES = ("fcfs", "vtc")
CURRENT_SRC = Path(__file__).resolve().parents[1] / "src"


def load(suite: str, shared: Path):
    if suite == "arena":
        return read_trace(shared / "traces" / "arena_vtc_600s.jsonl")
    return generate_suite("arena-x10", seed=0).records


def measure_in(src: Path, suite: str, policy: str, shared: Path) -> dict:
    """One measurement in a fresh interpreter that imports tokenfair from `src`."""
    env = dict(os.environ, PYTHONPATH=str(src))
    command = [sys.executable, __file__, "--worker", suite, policy, "--shared", str(shared)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def side_by_side(baseline: Path, current: Path, shared: Path, repeats: int) -> dict:
    rows = []
    for suite in ("arena", "arena_x10"):
        for policy in POLICIES:
            walls: dict[str, list[float]] = {"baseline": [], "current": []}
            results = {}
            for repeat in range(repeats):
                # Alternate which tree goes first, so drift in the machine hits both.
                order = [("baseline", baseline), ("current", current)]
                for name, src in order if repeat % 2 == 0 else order[::-1]:
                    run = measure_in(src, suite, policy, shared)
                    walls[name].append(run["wall_s"])
                    results[name] = (run["simulated_s"], run["simulated_tokens"])
            base, cur = statistics.median(walls["baseline"]), statistics.median(walls["current"])
            rows.append(
                {
                    "suite": suite,
                    "policy": policy,
                    "baseline_wall_s": round(base, 3),
                    "current_wall_s": round(cur, 3),
                    "ratio_current_to_baseline": round(cur / base, 3),
                    "same_simulation": results["baseline"] == results["current"],
                }
            )
    ratios = [row["ratio_current_to_baseline"] for row in rows]
    return {
        "benchmark": "simulator_speed",
        "baseline_src": str(baseline),
        "current_src": str(current),
        "repeats": repeats,
        "runs": rows,
        "ratio_geomean": round(statistics.geometric_mean(ratios), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared"
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another tree's src folder: measure it and this one side by side",
    )
    parser.add_argument(
        "--current-src", type=Path, default=CURRENT_SRC, help="the tree compared against it"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per tree (the median)")
    parser.add_argument("--worker", nargs=2, metavar=("SUITE", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        suite, policy = args.worker
        print(json.dumps(measure(load(suite, args.shared), policy)))
        return
    if args.baseline_src:
        report = side_by_side(
            args.baseline_src.resolve(), args.current_src.resolve(), args.shared, args.repeats
        )
        print(json.dumps(report))
        return
    arena, long_trace = load("arena", args.shared), load("arena_x10", args.shared)
    runs = [measure(arena, p) for p in POLICIES] + [measure(long_trace, p) for p in POLICIES]
    print(json.dumps({"benchmark": "simulator_speed", "arena": runs[:2], "arena_x10": runs[2:]}))


if __name__ == "__main__":
    main()
