"""A long-context neighbour: what a tenant flooding long prompts does to light tenants.

The workload (`tokenfair trace gen long-neighbor`, tokenfair/workloads/long_neighbor.py)
replayed through the simulator, in two cases:
- `a10g`: the A10G Llama-2-7B profile, engine preset, a 20,000-token KV pool;
  3,000-3,900-token prompts at 2/s beside two chat tenants at 1/s;
- `h200`: the H200 Llama-3-8B roofline, a 900,000-token pool (nothing queues for
  memory); 32k-64k-token prompts at 0.5/s beside two chat tenants at 2/s.

For each case and seed it runs the chat traffic alone, then the whole workload under
`fcfs`, `vtc` and `vtc-preempt` with the default settings (charges only: memory and
step not shared), and under `vtc` with `share_memory=True, step_share_tokens=1024`. It prints one JSON line: the chat tenants' TTFT p50/p99
and TPOT p50, their ratios to alone, the long tenant's throughput (its tokens over
the time from the first arrival to its last finish) and its ratio to `fcfs`'s, and
the preemptions. `--sweep` adds the trade curve: the default run at several
`step_share_tokens` values.

    python benchmarks/long_neighbor.py [--seeds 0,1,2] [--sweep] [--figure out.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import SchedulerConfig
from tokenfair.engine.sim.profile import load_profile
from tokenfair.engine.sim.simulator import simulate
from tokenfair.workloads.long_neighbor import A10G_CASE, H200_CASE, LONG_CLIENT
from tokenfair.workloads.suites import generate_workload

CASES = {
    "a10g": (A10G_CASE, "a10g-llama-7b", 20_000),
    "h200": (H200_CASE, "h200-llama-3-8b", 900_000),
}
BEFORE = {"share_memory": False, "step_share_tokens": None}  # charges only (the default)
SHARED = {"share_memory": True, "step_share_tokens": 1024}  # what a tenant holds, shared
RUNS = [
    ("fcfs", "fcfs", BEFORE),
    ("vtc (charges only)", "vtc", BEFORE),
    ("vtc-preempt (charges only)", "vtc-preempt", BEFORE),
    ("vtc (holdings shared)", "vtc", SHARED),
]
SWEEP = [256, 512, 768, 1024, 2048, 4096]


def chat_figures(results) -> dict:
    chat = [r for r in results if r.client != LONG_CLIENT and r.first_token_s is not None]
    ttft = np.array([r.first_token_s - r.arrival_s for r in chat])
    tpot = np.array(
        [
            (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
            for r in chat
            if r.output_tokens > 1
        ]
    )
    return {
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "tpot_p50_s": float(np.percentile(tpot, 50)),
    }


def run(case: str, seed: int, policy: str, settings: dict, with_long: bool = True) -> dict:
    spec, profile, kv_tokens = CASES[case]
    records = generate_workload(
        spec.client_specs(with_long=with_long), spec.duration_s, seed
    ).records
    config = SchedulerConfig(kv_tokens=kv_tokens, enable_prefix_caching=True, **settings)
    result = simulate(records, make_policy(policy), load_profile(profile), config)
    figures = chat_figures(result.results)
    long = [r for r in result.results if r.client == LONG_CLIENT and r.finish_s is not None]
    if long:
        first = min(r.arrival_s for r in result.results)
        tokens = sum(r.input_tokens + r.output_tokens for r in long)
        figures["long_tok_s"] = tokens / (max(r.finish_s for r in long) - first)
    figures["preemptions"] = result.preemptions_by_client
    return figures


def median_of(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 4)


def case_figures(case: str, seeds: list[int], sweep: bool) -> dict:
    alone = [run(case, seed, "vtc", BEFORE, with_long=False) for seed in seeds]
    rows = {}
    entries = list(RUNS)
    if sweep:
        entries += [
            (f"vtc, step share {c}", "vtc", {**SHARED, "step_share_tokens": c}) for c in SWEEP
        ]
    for label, policy, settings in entries:
        runs = [run(case, seed, policy, settings) for seed in seeds]
        rows[label] = {
            key: median_of(runs, key)
            for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "long_tok_s")
        }
        rows[label]["preemptions"] = [r["preemptions"] for r in runs]
    base = {key: median_of(alone, key) for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s")}
    fcfs = rows["fcfs"]["long_tok_s"]
    for row in rows.values():
        row["ttft_p99_x_alone"] = round(row["ttft_p99_s"] / base["ttft_p99_s"], 2)
        row["tpot_p50_x_alone"] = round(row["tpot_p50_s"] / base["tpot_p50_s"], 2)
        row["long_x_fcfs"] = round(row["long_tok_s"] / fcfs, 3)
    return {"alone": base, "runs": rows}


def plot(figures: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(figures), figsize=(5 * len(figures), 4))
    for ax, (case, data) in zip(np.atleast_1d(axes), figures.items(), strict=True):
        sweep = [
            (int(k.rsplit(" ", 1)[1]), v) for k, v in data["runs"].items() if "step share" in k
        ]
        sweep.sort()
        xs = [v["long_x_fcfs"] for _, v in sweep]
        ax.plot(xs, [v["tpot_p50_s"] * 1000 for _, v in sweep], "o-", label="chat TPOT p50 (ms)")
        ax.plot(xs, [v["ttft_p99_s"] * 1000 for _, v in sweep], "s-", label="chat TTFT p99 (ms)")
        for (limit, v), x in zip(sweep, xs, strict=True):
            ax.annotate(str(limit), (x, v["ttft_p99_s"] * 1000), fontsize=7)
        ax.set_xlabel("long tenant's throughput / fcfs's")
        ax.set_title(f"{case}: step share (tokens) trade")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--cases", default="a10g,h200")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--figure", help="with --sweep: write the trade figure here")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    figures = {case: case_figures(case, seeds, args.sweep) for case in args.cases.split(",")}
    if args.figure and args.sweep:
        plot(figures, args.figure)
    json.dump({"seeds": seeds, "cases": figures}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
