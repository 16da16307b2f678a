"""The fairness-efficiency frontier with prefix caching: a sweep on the simulator.

The `documents` workload (six backlogged clients, each asking about four 2,500-token
documents of its own, client-0 2.5x busier; `tokenfair trace gen documents`) on the
engine preset with prefix caching and the `a10g-llama-7b` profile, over KV pools
holding a fraction of the documents (0.2, 0.3, 0.5 of their footprint) and workload
variants (popularity skew 0 and 1 across a client's documents; 2 of the 4 documents
shared by every client), plus the controls where every prefix fits (a pool of 1.5x the
documents, and the `system-prompt` suite likewise), under each policy
(tokenfair.experiments.frontier).

Prints one JSON line per (variant, pool, policy): throughput, Max Diff, Avg Diff, Max
Diff per throughput, each also over VTC's in the same (variant, pool); the prefix hit
rate; preemptions; then a summary line (the Pareto-efficient policies of each (variant,
pool): none faster with less Max Diff per throughput). With `--out DIR`, also
DIR/frontier.jsonl (the cells), DIR/report.md and DIR/report.html with the frontier
figure, DIR/figures/frontier.png; `--from-json FILE` redraws them from a saved
frontier.jsonl without simulating.

Metrics (SPEC section 6): T = 300 s (the workload's duration), w = 60 s, warm-up 30 s;
throughput is the tokens served in [warm-up, T] per second (the queues drain long after
T), SPEC's own throughput kept beside it as spec_throughput_tok_s.

    python benchmarks/frontier.py [--quick] [--seeds N] [--policies fcfs,vtc,...]
        [--pools 0.2,0.3,0.5] [--skews 0,1] [--shared 2] [--no-controls] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tokenfair.core.policies import PolicyError, make_policy
from tokenfair.core.policies.loading import split_policies
from tokenfair.experiments.frontier import (
    FRONTIER_POLICIES,
    FRONTIER_POOLS,
    FRONTIER_SHARED,
    FRONTIER_SKEWS,
    FrontierCell,
    frontier_scenarios,
    frontier_settings,
    run_frontier,
)

QUICK_POLICIES = ("vtc", "vtc-lpm", "dlpm", "dlpm:1e12")


def numbers(text: str, option: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        sys.exit(f"error: {option}: expected comma-separated numbers, got {text!r}")
    if not values or any(v < 0 for v in values):
        sys.exit(f"error: {option}: expected numbers >= 0, got {text!r}")
    return values


def pareto(cells: list[FrontierCell]) -> list[str]:
    """Policies no other beats on both throughput and Max Diff per throughput."""
    return [
        c.policy
        for c in cells
        if not any(
            o.throughput_tok_s >= c.throughput_tok_s
            and o.max_diff_per_throughput <= c.max_diff_per_throughput
            and (
                o.throughput_tok_s > c.throughput_tok_s
                or o.max_diff_per_throughput < c.max_diff_per_throughput
            )
            for o in cells
        )
    ]


def summary(cells: list[FrontierCell], settings: dict, wall_s: float | None) -> dict:
    by_scenario: dict[tuple[str, float], list[FrontierCell]] = {}
    for cell in cells:
        by_scenario.setdefault((cell.variant, cell.pool_fraction), []).append(cell)
    scenarios = []
    for (variant, pool), group in by_scenario.items():
        hits = [c.prefix_hit_rate for c in group]
        fastest = max(group, key=lambda c: c.throughput_tok_s)
        scenarios.append(
            {
                "variant": variant,
                "pool_fraction": pool,
                "kv_tokens": group[0].kv_tokens,
                "pareto": pareto(group),
                "fastest": fastest.policy,
                "fastest_throughput_vs_vtc": fastest.throughput_vs_vtc,
                "fastest_max_diff_vs_vtc": fastest.max_diff_vs_vtc,
                "hit_rate_range": [round(min(hits), 4), round(max(hits), 4)],
            }
        )
    out: dict = {"benchmark": "frontier", "settings": settings, "scenarios": scenarios}
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 1)
    return out


def write_outputs(cells: list[FrontierCell], settings: dict, out: Path) -> None:
    from tokenfair.report.frontier_report import write_frontier_report

    out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(c.to_json()) for c in cells]
    (out / "frontier.jsonl").write_text("\n".join(lines) + "\n")
    (out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    report = write_frontier_report(cells, out, settings)
    print(f"report: {report}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(FRONTIER_POLICIES))
    parser.add_argument("--pools", default=",".join(f"{p:g}" for p in FRONTIER_POOLS))
    parser.add_argument("--skews", default=",".join(f"{s:g}" for s in FRONTIER_SKEWS))
    parser.add_argument(
        "--shared", type=int, default=FRONTIER_SHARED, help="shared documents variant (0: none)"
    )
    parser.add_argument("--no-controls", action="store_true", help="leave the controls out")
    parser.add_argument("--seeds", type=int, default=3, help="draws of each cell, averaged")
    parser.add_argument(
        "--quick", action="store_true", help="1 seed, pools 0.2 and 0.5, skew 0, 4 policies"
    )
    parser.add_argument("--workers", type=int, default=2, help="simulations in parallel")
    parser.add_argument("--out", type=Path, help="write frontier.jsonl, the report and figure")
    parser.add_argument("--from-json", type=Path, help="redraw from a saved frontier.jsonl")
    args = parser.parse_args()

    if args.from_json is not None:
        rows = [json.loads(line) for line in args.from_json.read_text().splitlines() if line]
        cells = [FrontierCell.from_json(row) for row in rows]
        settings_file = args.from_json.with_name("settings.json")
        settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
        write_outputs(cells, settings, args.out or args.from_json.parent)
        print(json.dumps(summary(cells, settings, None)))
        return

    policies = split_policies(args.policies)
    if args.quick and args.policies == parser.get_default("policies"):
        policies = list(QUICK_POLICIES)
    if "vtc" not in policies:
        sys.exit("error: --policies must include vtc: every ratio is to VTC's")
    for name in policies:
        try:
            make_policy(name)
        except (PolicyError, ValueError) as error:
            sys.exit(f"error: --policies: {error}")
    pools = numbers(args.pools, "--pools")
    skews = numbers(args.skews, "--skews")
    seeds = range(args.seeds)
    shared = args.shared
    if args.quick:
        pools, skews, shared, seeds = [0.2, 0.5], [0.0], 0, range(1)
    if any(p <= 0 for p in pools):
        sys.exit("error: --pools: every pool must be a fraction > 0 of the footprint")
    scenarios = frontier_scenarios(pools, skews, shared, controls=not args.no_controls)
    settings = frontier_settings(scenarios, policies, list(seeds))

    def progress(done: int, total: int, label: str) -> None:
        print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    cells = run_frontier(scenarios, policies, seeds, args.workers, progress)
    wall = time.perf_counter() - started
    for cell in cells:
        print(json.dumps(cell.to_json()))
    print(json.dumps(summary(cells, settings, wall)))
    if args.out is not None:
        write_outputs(cells, settings, args.out)


if __name__ == "__main__":
    main()
