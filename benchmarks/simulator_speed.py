"""Simulator speed: simulated tokens per wall second, on the arena trace and on a 10x
longer synthetic trace (the `arena-x10` suite). Prints one JSON line.

    python benchmarks/simulator_speed.py [--shared ../shared]
"""

from __future__ import annotations

import argparse
import json
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
        "wall_s": round(wall, 3),
        "simulated_tokens_per_wall_s": round(tokens / wall),
        "speedup_vs_real_time": round(result.makespan_s / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared"
    )
    args = parser.parse_args()
    arena = read_trace(args.shared / "traces" / "arena_vtc_600s.jsonl")
    long_trace = generate_suite("arena-x10", seed=0).records
    runs = [measure(arena, p) for p in ("fcfs", "vtc")] + [
        measure(long_trace, p) for p in ("fcfs", "vtc")
    ]
    print(json.dumps({"benchmark": "simulator_speed", "arena": runs[:2], "arena_x10": runs[2:]}))


if __name__ == "__main__":
    main()
