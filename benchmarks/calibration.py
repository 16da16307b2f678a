"""Calibration on this machine: a profile measured with `tokenfair profile` predicts a
real run's makespan. Replays one small trace on the real engine (builtin:tiny, CPU) and
in the simulator under the profile just measured. Prints one JSON line.

    python benchmarks/calibration.py [--threads 1]

Timings depend on the machine and what else runs on it: this is a measurement, not a
test (tests/engine/hf/test_hf_calibration.py checks the pipeline's arithmetic).
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from tokenfair.core.policies.registry import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.hf.factory import make_hf_engine
from tokenfair.engine.hf.loader import load_model
from tokenfair.engine.hf.profile import measure_profile
from tokenfair.engine.hf.replay import replay_trace
from tokenfair.engine.sim.simulator import simulate
from tokenfair.workloads.trace import TraceRecord


def small_trace(count: int = 40, seed: int = 0) -> list[TraceRecord]:
    rng = random.Random(seed)
    return [
        TraceRecord(
            arrival_s=i * 0.05,
            client=f"c{i % 3}",
            input_tokens=rng.randint(20, 300),
            output_tokens=rng.randint(20, 120),
            request_id=f"r{i}",
        )
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # One intra-op thread holds up best when other processes share the cores.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("builtin:tiny", device="cpu")
    profile = measure_profile(loaded)
    trace = small_trace()
    options = dict(kv_tokens=16384, max_num_seqs=32, max_batched_tokens=1024)
    real = replay_trace(make_hf_engine(loaded, policy="vtc", **options), trace, vocab_size=262)
    simulated = simulate(trace, make_policy("vtc"), profile, SchedulerConfig(**options))
    print(
        json.dumps(
            {
                "benchmark": "calibration",
                "threads": args.threads,
                "requests": len(trace),
                "real_makespan_s": round(real.makespan_s, 3),
                "simulated_makespan_s": round(simulated.makespan_s, 3),
                "simulated_over_real": round(simulated.makespan_s / real.makespan_s, 3),
                "target": "within 0.75 .. 1.25",
            }
        )
    )


if __name__ == "__main__":
    main()
