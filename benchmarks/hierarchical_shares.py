"""Hierarchical shares on a 3-level tree, on the simulator and through `tokenfair serve`.

The tree: two organisations at weights 2:1, each with two teams (weight 1 each); team
org-a/search has a heavy key (always backlogged) and a light key (a request now and
then); every other team has one backlogged key.

- service: over the window where every backlogged key has requests waiting, each
  level's backlogged siblings' service against their weighted share (org-a : org-b =
  2 : 1, search : ads = 1 : 1, x : y = 1 : 1); a request's service is spread over
  [first token, finish] as in SPEC section 6;
- the light key's TTFT p90 among all of them, against its TTFT p90 alone.

    .venv/bin/python benchmarks/hierarchical_shares.py            # simulator, then server
    .venv/bin/python benchmarks/hierarchical_shares.py --skip-server

Prints one JSON line per run and a summary line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tokenfair.core.policies import make_policy  # noqa: E402
from tokenfair.core.scheduler import SchedulerConfig  # noqa: E402
from tokenfair.core.share_tree import ShareTree, group_id  # noqa: E402
from tokenfair.engine.sim.profile import load_profile  # noqa: E402
from tokenfair.engine.sim.simulator import simulate  # noqa: E402
from tokenfair.workloads.trace import TraceRecord  # noqa: E402

GROUPS = {"org-a": None, "org-a/search": "org-a", "org-a/ads": "org-a",
          "org-b": None, "org-b/x": "org-b", "org-b/y": "org-b"}  # fmt: skip
MEMBERS = {"heavy": "org-a/search", "light": "org-a/search", "ads": "org-a/ads",
           "bx": "org-b/x", "by": "org-b/y"}  # fmt: skip
WEIGHTS = {group_id("org-a"): 2.0}
BACKLOGGED = ("heavy", "ads", "bx", "by")
# Each level's backlogged siblings and their weighted share of their parent's service.
LEVELS = {
    "orgs": {"org-a": 2 / 3, "org-b": 1 / 3},
    "org-a teams": {"org-a/search": 0.5, "org-a/ads": 0.5},
    "org-b teams": {"org-b/x": 0.5, "org-b/y": 0.5},
}
W_IN, W_OUT = 1.0, 2.0
# The first requests start together and none ends for ~10 s (256 decode steps): service
# and TTFT are measured after that.
WARMUP_S = 15.0


def trace(duration: float, seed: int, without: tuple[str, ...] = ()) -> list[TraceRecord]:
    """Backlogged keys: Poisson arrivals far above capacity; light: 0.5 requests/s."""
    rng = random.Random(seed)
    records: list[TraceRecord] = []
    clients = {c: (3.0, 256, 256) for c in BACKLOGGED}
    clients["light"] = (0.5, 32, 32)
    for gone in without:
        del clients[gone]
    for client, (rate, prompt, output) in clients.items():
        t = rng.uniform(0, 1 / rate)
        while t < duration:
            records.append(TraceRecord(t, client, prompt, output, f"{client}-{len(records)}"))
            t += rng.expovariate(rate)
    return sorted(records, key=lambda r: r.arrival_s)


def service_in(results, start: float, end: float) -> dict[str, float]:
    """Service per client in [start, end), each request's spread over [first token,
    finish] (SPEC section 6)."""
    totals: dict[str, float] = {}
    for r in results:
        if r.first_token_s is None or r.finish_s is None:
            continue
        s = W_IN * r.input_tokens + W_OUT * r.output_tokens
        span = max(r.finish_s - r.first_token_s, 1e-9)
        overlap = max(0.0, min(end, r.finish_s) - max(start, r.first_token_s))
        totals[r.client] = totals.get(r.client, 0.0) + s * min(1.0, overlap / span)
    return totals


def level_report(by_client: dict[str, float]) -> dict[str, dict[str, float]]:
    """For each level: each sibling's share of the level's service, its target, and the
    deviation |share - target| / target."""
    tree = ShareTree.build(GROUPS, MEMBERS)
    by_node: dict[str, float] = {}
    for client, amount in by_client.items():
        for node in tree.path(client)[:-1]:
            by_node[node[1:]] = by_node.get(node[1:], 0.0) + amount
    report: dict[str, dict[str, float]] = {}
    for level, targets in LEVELS.items():
        total = sum(by_node.get(g, 0.0) for g in targets)
        for group, target in targets.items():
            share = by_node.get(group, 0.0) / total if total else 0.0
            report[f"{level}: {group}"] = {
                "share": round(share, 4),
                "target": round(target, 4),
                "deviation": round(abs(share - target) / target, 4),
            }
    return report


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else float("nan")


def run_simulator(duration: float, seed: int) -> dict[str, object]:
    profile = load_profile("a10g-llama-7b")
    config = SchedulerConfig.from_dict({"kv_tokens": 10_000, "max_num_seqs": 256})
    tree = ShareTree.build(GROUPS, MEMBERS)

    def run(records: list[TraceRecord]):
        return simulate(records, make_policy("vtc", weights=WEIGHTS, tree=tree), profile, config)

    mixed = run(trace(duration, seed))
    # "Alone": the light key without the heavy key in its team (the other teams as
    # busy as before), and the light key alone on the deployment.
    alone = run(trace(duration, seed, without=("heavy",)))
    idle = run(trace(duration, seed, without=BACKLOGGED))
    # Every backlogged key has requests waiting from the first seconds until its
    # arrivals stop: the window is [WARMUP_S, duration].
    report = level_report(service_in(mixed.results, WARMUP_S, duration))

    def light_ttfts(result) -> list[float]:
        return [
            r.first_token_s - r.arrival_s
            for r in result.results
            if r.client == "light" and r.first_token_s is not None and r.arrival_s >= WARMUP_S
        ]

    light_mixed, light_alone = p90(light_ttfts(mixed)), p90(light_ttfts(alone))
    light_idle = p90(light_ttfts(idle))
    return {
        "run": "simulator",
        "profile": profile.name,
        "duration_s": duration,
        "levels": report,
        "worst_deviation": max(v["deviation"] for v in report.values()),
        "light_ttft_p90_s": round(light_mixed, 4),
        "light_alone_ttft_p90_s": round(light_alone, 4),
        "light_ttft_ratio": round(light_mixed / light_alone, 3),
        "light_on_an_idle_deployment_ttft_p90_s": round(light_idle, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--server-duration", type=float, default=40.0)
    args = parser.parse_args()
    results = [run_simulator(args.duration, args.seed)]
    print(json.dumps(results[-1]))
    if not args.skip_server:
        from benchmarks.hierarchical_server import run_server

        results.append(run_server(args.server_duration, args.seed))
        print(json.dumps(results[-1]))
    print(
        json.dumps(
            {
                "summary": {
                    r["run"]: {
                        "worst_deviation": r["worst_deviation"],
                        "light_ttft_ratio": r["light_ttft_ratio"],
                    }
                    for r in results
                }
            }
        )
    )


if __name__ == "__main__":
    main()
