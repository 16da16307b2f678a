"""Fair and cache-efficient at once: locality-aware fair scheduling, measured.

Simulator: the `system-prompt` and `multiturn` suites (clients sharing prompt
prefixes) on the engine preset with prefix caching and a KV pool small enough that the
clients' prefixes compete (3,072 and 8,000 tokens), under fcfs, vtc, vtc-lpm and dlpm,
averaged over seeds: throughput, prefix hit rate, Max Diff, and the fluid fair-share
ideal at each run's own capacity (tokenfair.experiments.locality).

Prints one JSON line. Compare ratios between policies of the same run, not absolute
figures between machines.

    python benchmarks/locality.py [--seeds N] [--quick]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from tokenfair.experiments.locality import run_locality_experiment


def simulator_figures(seeds: int) -> dict:
    result = run_locality_experiment(seeds=range(seeds))
    figures: dict = {"seeds": seeds, "settings": result.settings, "rows": []}
    for row in result.rows:
        vtc = result.row(row.suite, "vtc")
        figures["rows"].append(
            {
                **asdict(row),
                "throughput_vs_vtc": round(row.throughput_tok_s / vtc.throughput_tok_s, 3),
                "max_diff_vs_vtc": round(row.max_diff / vtc.max_diff, 3),
            }
        )
    best = max(
        (r for r in figures["rows"] if r["suite"] == "system-prompt" and r["policy"] != "vtc"),
        key=lambda r: r["throughput_vs_vtc"],
    )
    figures["system_prompt_best"] = {
        "policy": best["policy"],
        "throughput_vs_vtc": best["throughput_vs_vtc"],
        "max_diff_vs_vtc": best["max_diff_vs_vtc"],
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="draws of each suite, averaged")
    parser.add_argument("--quick", action="store_true", help="one seed")
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    print(json.dumps({"benchmark": "locality", "simulator": simulator_figures(seeds)}))


if __name__ == "__main__":
    main()
