"""Each policy's Max Diff against the fluid fair-share ideal of the same capacity.

The paper's arena trace (1,500 Chatbot Arena requests from 27 clients over 600 s) under
every built-in policy, on the paper preset (the S-LoRA/LightLLM router) and the engine
preset (vLLM-like, prefix caching on; the trace shares no prefixes), both with the
paper's 10,000-token KV pool and the `a10g-llama-7b` profile. Each (preset, policy) is
replayed N times (default 10), every arrival moved by a uniform +-1 ms (seeded; seed k
for replay k, the same jitter for every policy), because one run's Max Diff swings with
timing detail far below anything measured (docs/simulator.md).

For each run: Max Diff (SPEC section 6: T = 600 s, w = 60 s, warm-up 30 s), the Max
Diff of the fluid ideal (generalized processor sharing delivering, second by second,
what the run delivered: tokenfair.fairness.fluid), and throughput (SPEC: first arrival
to last finish). Prints one JSON object: per preset and policy the medians over the
replays, the ratio of the medians (Max Diff over the ideal's: 1 would be as fair as
anything with that capacity can be), the median of the per-run ratios, and throughput
over VTC's median in the same preset.

    python benchmarks/fluid_ideal.py [--replays 10] [--policies EXTRA,...]
        [--presets paper,engine] [--shared ../shared] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tokenfair.bundled import data_dir
from tokenfair.core.policies import PolicyError, make_policy
from tokenfair.core.policies.loading import split_policies
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.experiments.locality import LOCALITY_ENGINE_SETTINGS
from tokenfair.experiments.seeds import JITTER_S, jittered_records
from tokenfair.experiments.workloads import ARENA_DURATION_S, ARENA_TRACE
from tokenfair.fairness.fluid import compare_with_fluid
from tokenfair.fairness.metrics import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S
from tokenfair.fairness.report import fairness_report
from tokenfair.workloads.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_POLICIES = (
    "fcfs",
    "lcf",
    "vtc",
    "vtc-predict",
    "vtc-oracle",
    "vtc-preempt",
    "vtc-lpm",
    "vtc-hit",
    "dlpm",
)
PRESETS = ("paper", "engine")
KV_TOKENS = 10_000  # the paper's pool


def config_of(preset: str, kv_tokens: int) -> SchedulerConfig:
    if preset == "paper":
        return SchedulerConfig.paper(kv_tokens)
    return SchedulerConfig(kv_tokens=kv_tokens, **LOCALITY_ENGINE_SETTINGS)


def replay(job: tuple[Path, str, str, int, int]) -> dict[str, Any]:
    """One jittered replay: Max Diff, the fluid ideal's, throughput (in a worker)."""
    trace_path, preset, policy, seed, kv_tokens = job
    trace = jittered_records(read_trace(trace_path), seed)  # as experiment paper --seeds
    run = simulate(
        trace, make_policy(policy), load_profile("a10g-llama-7b"), config_of(preset, kv_tokens)
    )
    t, w, warmup = ARENA_DURATION_S, DEFAULT_WINDOW_S, DEFAULT_WARMUP_S
    report = fairness_report(run.results, duration_s=t, window_s=w, warmup_s=warmup)
    fluid = compare_with_fluid(run.results, duration_s=t, window_s=w, warmup_s=warmup)
    return {
        "preset": preset,
        "policy": policy,
        "seed": seed,
        "max_diff": report.max_diff,
        "fluid_max_diff": fluid.max_diff,
        "fluid_shortfall": fluid.max_shortfall,
        "throughput_tok_s": report.throughput_tok_s,
    }


def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarise(runs: list[dict[str, Any]], presets: list[str], policies: list[str]) -> dict:
    out: dict[str, Any] = {}
    for preset in presets:
        rows: dict[str, Any] = {}
        for policy in policies:
            mine = [r for r in runs if r["preset"] == preset and r["policy"] == policy]
            max_diff = _median([r["max_diff"] for r in mine])
            fluid = _median([r["fluid_max_diff"] for r in mine])
            rows[policy] = {
                "replays": len(mine),
                "max_diff_median": round(max_diff, 2),
                "max_diff_min": round(min(r["max_diff"] for r in mine), 2),
                "max_diff_max": round(max(r["max_diff"] for r in mine), 2),
                "fluid_max_diff_median": round(fluid, 2),
                "ratio": round(max_diff / fluid, 3) if fluid else None,
                "ratio_median_per_run": round(
                    _median([r["max_diff"] / r["fluid_max_diff"] for r in mine]), 3
                )
                if all(r["fluid_max_diff"] for r in mine)
                else None,
                "fluid_shortfall_median": round(_median([r["fluid_shortfall"] for r in mine]), 1),
                "throughput_tok_s_median": round(_median([r["throughput_tok_s"] for r in mine]), 1),
            }
        vtc = rows.get("vtc", {}).get("throughput_tok_s_median")
        for row in rows.values():
            row["throughput_vs_vtc"] = (
                round(row["throughput_tok_s_median"] / vtc, 4) if vtc else None
            )
        out[preset] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=10, help="jittered replays per policy")
    parser.add_argument("--policies", default="", help="extra policies, comma-separated")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--kv-tokens", type=int, default=KV_TOKENS)
    parser.add_argument(
        "--shared", type=Path, help="a shared/ folder (default: ../shared, else bundled)"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    shared = args.shared
    if shared is None and (ROOT.parent / "shared" / ARENA_TRACE).exists():
        shared = ROOT.parent / "shared"
    trace_path = data_dir(shared) / ARENA_TRACE
    if not trace_path.exists():
        sys.exit(f"error: no arena trace at {trace_path}")
    policies = list(dict.fromkeys([*BUILTIN_POLICIES, *split_policies(args.policies)]))
    for name in policies:
        try:
            make_policy(name)
        except (PolicyError, ValueError) as error:
            sys.exit(f"error: --policies: {error}")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    if not presets or any(p not in PRESETS for p in presets):
        sys.exit(f"error: --presets: expected some of {', '.join(PRESETS)}, got {args.presets!r}")
    if args.replays < 1:
        sys.exit("error: --replays must be >= 1")

    jobs = [
        (trace_path, preset, policy, seed, args.kv_tokens)
        for preset in presets
        for policy in policies
        for seed in range(args.replays)
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        runs = list(pool.map(replay, jobs))
    figures = {
        "benchmark": "fluid_ideal",
        "trace": str(trace_path),
        "kv_tokens": args.kv_tokens,
        "profile": "a10g-llama-7b",
        "metrics": "SPEC section 6: T = 600 s, w = 60 s, warm-up 30 s",
        "jitter": f"uniform +-{JITTER_S * 1e3:g} ms per arrival, seed = replay index",
        "replays": args.replays,
        "presets": summarise(runs, presets, policies),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
