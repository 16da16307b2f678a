"""Any mix of tenants: does a light tenant notice the heavy ones?

The promise: a tenant under its weighted share of every resource (seats, KV blocks, the
step's tokens) is not delayed by tenants over theirs, however many they are and
whatever they fill. This runs random mixes (tokenfair/workloads/mixes.py, `tokenfair
trace gen mix`: 1-3 heavy tenants flooding long prompts beside 2-5 light chat tenants,
weights 1-4 in half of them) on the A10G and H200 profiles under `vtc` (the default
contention rules), `fcfs` and `vtc` with charges only (memory and step not shared),
and each light tenant alone (tokenfair/experiments/mixes.py says how, and defines a
tenant's demand as a share of its weighted share).

Prints one JSON line: `summary` per profile and run (for the light tenants under 60%
and under 90% of their share, the median and worst TTFT p99 ÷ alone; how many notice
the heavy tenants: TTFT p99 over 2x alone on the A10G, over 0.5 s on the H200; the
worst heavy throughput ÷ fcfs), `light` (every light tenant: weight, demand, share,
demand ÷ share, alone TTFT p99 / TPOT p50, and under each run both and their ratios to
alone), `mixes` (each mix's tenants and the heavy tenants' throughput under each run
and ÷ fcfs), and the wall time.

    python benchmarks/any_mix.py [--mixes 30] [--profiles a10g,h200] [--workers 2]
                                 [--figure out.png] [--quick]

Run time on this 2-core machine: each mix is 3 runs and its 2-5 light tenants alone,
about 0.7 s of CPU for an A10G mix and 4 s for an H200 mix (the long prompts' many
steps). `--mixes 30` on both profiles, 2 workers: about 70 s on idle cores; 373 s
(6.2 s a mix) measured with the cores shared with other jobs (load 4-7). `--quick`
(3 A10G mixes): a few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

from tokenfair.experiments.mixes import mix_jobs, mix_rows, summary
from tokenfair.experiments.runner import run_jobs
from tokenfair.workloads.mixes import PROFILES, mix_spec

QUICK_MIXES = 3


def fail(message: str) -> NoReturn:
    print(f"any_mix.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def whole(option: str, text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        fail(f"{option} must be a whole number >= {low}, got {text!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mixes", default="30", help="how many mixes: seeds 0..N-1 (30)")
    parser.add_argument("--profiles", default="a10g,h200", help="a10g, h200 or both (a10g,h200)")
    parser.add_argument("--workers", default="2", help="simulations at once (2)")
    parser.add_argument("--figure", type=Path, help="write the scatter figure (PNG) here")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MIXES} A10G mixes")
    args = parser.parse_args()
    mixes = whole("--mixes", args.mixes, 1)
    workers = whole("--workers", args.workers, 1)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown or not profiles:
        fail(f"--profiles {args.profiles!r}: expected a10g, h200 or a10g,h200")
    if args.quick:
        mixes, profiles = QUICK_MIXES, ["a10g"]
    if args.figure is not None and args.figure.is_dir():
        fail(
            f"--figure {args.figure} is a folder: give a file path, e.g. {args.figure / 'mix.png'}"
        )
    seeds = list(range(mixes))
    started = time.perf_counter()
    jobs = mix_jobs(seeds, profiles)

    def progress(done: int, total: int, label: str) -> None:
        if done % max(1, total // 10) == 0 or done == total:
            print(f"{done}/{total} runs ({time.perf_counter() - started:.0f} s)", file=sys.stderr)

    lights, rows = mix_rows(run_jobs(jobs, workers, progress))
    wall = time.perf_counter() - started
    if args.figure is not None:
        from tokenfair.report.mixes_report import plot_any_mix

        plot_any_mix(lights, args.figure)
    specs = {(p, s): mix_spec(s, p).to_json() for p in profiles for s in seeds}
    json.dump(
        {
            "mixes": len(seeds),
            "profiles": profiles,
            "engine": "engine defaults, profile's pool, prefix caching on; charges only = "
            "share_memory off, no step share",
            "summary": summary(lights, rows),
            "wall_s": round(wall, 1),
            "wall_s_per_mix": round(wall / (len(seeds) * len(profiles)), 2),
            "light": [asdict(row) for row in lights],
            "mix_rows": [{**asdict(row), "tenants": specs[row.profile, row.seed]} for row in rows],
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
