"""Fair and cache-efficient at once: locality-aware fair scheduling, measured.

Simulator: the `system-prompt` and `multiturn` suites (clients sharing prompt
prefixes) on the engine preset with prefix caching and a KV pool small enough that the
clients' prefixes compete (3,072 and 8,000 tokens), under fcfs, vtc, vtc-lpm and dlpm,
averaged over seeds: throughput, prefix hit rate, Max Diff, and the fluid fair-share
ideal at each run's own capacity (tokenfair.experiments.locality).

Gateway: the same suites replayed in real time at a compressed scale through
`tokenfair gateway` in front of three `tokenfair serve --model sim:...` upstreams
(prefix caching on, salted per tenant; KV pools of 6,144 tokens for `system-prompt`,
a third of its clients' system prompts, so the three together hold them all and one
alone does not, and 20,000 for `multiturn`, what an A10G holds for Llama-2-7B), under
`routing: least-loaded` and `routing: prefix-affinity`, fresh upstreams for each.
`--suites documents` adds the document workload (six backlogged clients, four private
documents each; pools of 6,000 tokens), and `--upstream-policy vtc,vtc-hit` runs every
routing under each upstream policy, with throughput and Max Diff beside the hit rates.
Compressed: the first `--gateway-seconds` of the suite, its arrivals and the
upstreams' step times (the `a10g-llama-7b` profile) both divided by `--speedup`, so the
engines see the same work at the same relative pace. Prompts are text whose tokens
(4 bytes each, as sim upstreams count them) follow the trace's prefix fields: requests
of a group share exactly their first prefix_tokens. Figures: the prefix hit rate (the
prompt tokens the upstreams report cached in each request's usage, over prompt
tokens), for every client and for the light ones (fewer requests than average), and
the light clients' TTFT p90 as they see it (scaled back to the suite's time).

Prints one JSON line. Compare ratios between policies or routings of the same run, not
absolute figures between machines.

    python benchmarks/locality.py [--seeds N] [--quick] [--part simulator|gateway|all]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tokenfair.engine.sim.profile import load_profile
from tokenfair.experiments.locality import LOCALITY_POOLS, light_clients, run_locality_experiment
from tokenfair.fairness.metrics import ttft_percentiles
from tokenfair.fairness.report import fairness_report
from tokenfair.results import ResultRecord
from tokenfair.workloads.suites import documents_workload, generate_suite
from tokenfair.workloads.trace import TraceRecord

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gateway.processes import Process, gateway, metrics, sim_upstream  # noqa: E402

ROUTINGS = ("least-loaded", "prefix-affinity")
UPSTREAMS = 3
# Each upstream's KV pool: for system-prompt, the three together hold every client's
# prompt and one alone does not (ten prompts of 1,000-2,000 tokens, 15,000 in all); for
# multiturn, an A10G's pool for Llama-2-7B.
# For documents (six clients asking about four private documents of 2,500 tokens each,
# backlogged), 6,000 tokens each: the three together hold 0.3 of the documents, and
# prefix affinity gives each upstream about a third of them to hold.
GATEWAY_POOLS = {"system-prompt": 6144, "multiturn": 20000, "documents": 6000}
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


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


def text_tokens(name: str, start: int, count: int) -> str:
    """`count` tokens of the text named `name` from position `start`: 4 bytes each
    (three letters and a space), the same for the same name and positions."""
    if count <= 0:
        return ""
    positions = np.arange(start, start + count, dtype=np.uint64)
    mixed = (positions * np.uint64(2654435761) + np.uint64(zlib.crc32(name.encode()))) % (
        np.uint64(26**3)
    )
    digits = np.stack([mixed // 676, (mixed // 26) % 26, mixed % 26], axis=1).astype(np.intp)
    words = np.concatenate([LETTERS[digits], np.full((count, 1), 32, dtype=np.uint8)], axis=1)
    return words.tobytes().decode("ascii")


def prompt_text(record: TraceRecord) -> str:
    """The prompt: its group's shared text for prefix_tokens, then text of its own."""
    shared = record.prefix_tokens or 0
    head = text_tokens(record.prefix_group, 0, shared) if record.prefix_group else ""
    return head + text_tokens(record.request_id, shared, record.input_tokens - shared)


def scaled_profile(path: Path, speedup: float) -> Path:
    """The A10G profile with every step time divided by `speedup`, as a JSON file."""
    profile = load_profile("a10g-llama-7b").to_json()
    for key, value in profile.items():
        if key.endswith("_s") and isinstance(value, float):
            profile[key] = value / speedup
    profile["name"] = f"a10g-llama-7b/{speedup:g}"
    path.write_text(json.dumps(profile))
    return path


async def replay(
    url: str, records: list[TraceRecord], speedup: float
) -> list[tuple[ResultRecord, int]]:
    """Send every record at its (compressed) arrival, streaming; time its first token.
    Each result comes with the prompt tokens the upstream found in its cache."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        origin = time.perf_counter()

        async def one(record: TraceRecord) -> tuple[ResultRecord, int]:
            arrival = record.arrival_s / speedup
            await asyncio.sleep(max(0.0, origin + arrival - time.perf_counter()))
            body = {
                "model": "sim",
                "prompt": prompt_text(record),
                "max_tokens": record.output_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "user": record.client,
            }
            first, cached = None, 0
            async with http.stream("POST", url + "/v1/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith('data: {"'):
                        continue
                    if first is None and '"text":"' in line:
                        first = time.perf_counter() - origin
                    elif '"usage":{' in line:
                        usage = json.loads(line[6:])["usage"]
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            result = ResultRecord(
                request_id=record.request_id,
                client=record.client,
                arrival_s=arrival,
                input_tokens=record.input_tokens,
                output_tokens=record.output_tokens,
                first_token_s=max(first, arrival) if first is not None else None,
                finish_s=time.perf_counter() - origin,
            )
            return result, cached

        return list(await asyncio.gather(*(one(r) for r in records)))


def hit_rate(replies: list[tuple[ResultRecord, int]], clients: set[str] | None = None) -> float:
    """Prompt tokens the upstreams served from their caches, over all prompt tokens."""
    chosen = [(r, c) for r, c in replies if clients is None or r.client in clients]
    prompts = sum(r.input_tokens for r, _ in chosen)
    return round(sum(c for _, c in chosen) / prompts, 4) if prompts else 0.0


def suite_records(suite: str) -> list[TraceRecord]:
    if suite == "documents":
        return documents_workload().records
    return generate_suite(suite).records


def through_gateway(
    suite: str, routing: str, policy: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    records = [r for r in suite_records(suite) if r.arrival_s < args.gateway_seconds]
    profile = scaled_profile(tmp / "profile.json", args.speedup)
    options = ["--enable-prefix-caching", "--tenant-from-user"]
    options += ["--kv-tokens", str(GATEWAY_POOLS[suite]), "--policy", policy]
    upstreams: list[Process] = []
    gw = None
    try:
        for i in range(UPSTREAMS):
            upstreams.append(
                sim_upstream(tmp, f"{suite}-{routing}-{i}", *options, profile=str(profile))
            )
        configs = [
            {"url": u.url, "models": ["sim"], "max_concurrent": args.slots, "name": f"sim{i}"}
            for i, u in enumerate(upstreams)
        ]
        gw = gateway(
            tmp,
            configs,
            name=f"gateway-{suite}-{routing}",
            routing=routing,
            tenants=None,
            tenant_from_user=True,
            max_waiting=100000,
        )
        replies = asyncio.run(replay(gw.url, records, args.speedup))
        results = [r for r, _ in replies]
        hits = queries = 0.0
        for upstream in upstreams:
            values = metrics(upstream)
            hits += values.get(("tokenfair:prefix_cache_hits_total", ()), 0.0)
            queries += values.get(("tokenfair:prefix_cache_queries_total", ()), 0.0)
        light = light_clients(results)
        light_ttft = ttft_percentiles([r for r in results if r.client in light])["*"]["p90"]
        # In the suite's own time: compressed seconds times the speedup.
        scaled = [
            replace(
                r,
                arrival_s=r.arrival_s * args.speedup,
                first_token_s=None if r.first_token_s is None else r.first_token_s * args.speedup,
                finish_s=None if r.finish_s is None else r.finish_s * args.speedup,
            )
            for r in results
        ]
        fairness = fairness_report(scaled, duration_s=args.gateway_seconds)
        served = sum(r.input_tokens + r.output_tokens for r in scaled)
        return {
            "suite": suite,
            "routing": routing,
            "upstream_policy": policy,
            "max_diff": round(fairness.max_diff, 1),
            # input + output tokens over first arrival to last finish (SPEC's throughput)
            "throughput_tok_s": round(served / max(r.finish_s or 0.0 for r in scaled), 1),
            "requests": len(records),
            # First admissions, as the clients' usage reports them...
            "hit_rate": hit_rate(replies),
            "light_hit_rate": hit_rate(replies, light),
            # ...and every lookup the engines made (re-prefills after preemption too).
            "engine_hit_rate": round(hits / queries, 4) if queries else None,
            # Compressed seconds times the speedup: the suite's own time scale.
            "light_ttft_p90_s": round(light_ttft * args.speedup, 3) if light_ttft else None,
            "all_ttft_p90_s": round(
                (ttft_percentiles(results)["*"]["p90"] or 0.0) * args.speedup, 3
            ),
        }
    finally:
        if gw is not None:
            gw.stop()
        for upstream in upstreams:
            upstream.stop()


def gateway_figures(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="locality-gateway-"))
    suites = args.suites.split(",")
    policies = args.upstream_policy.split(",")
    try:
        runs = [
            through_gateway(suite, routing, policy, args, tmp)
            for suite in suites
            for policy in policies
            for routing in ROUTINGS
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures: dict[str, Any] = {
        "upstreams": UPSTREAMS,
        "speedup": args.speedup,
        "seconds_of_suite": args.gateway_seconds,
        "upstream_policy": args.upstream_policy,
        "kv_tokens_per_upstream": GATEWAY_POOLS,
        "slots_per_upstream": args.slots,
        "runs": runs,
    }
    for suite, policy in ((s, p) for s in suites for p in policies):
        least, affine = (
            next(
                r
                for r in runs
                if r["suite"] == suite and r["routing"] == m and r["upstream_policy"] == policy
            )
            for m in ROUTINGS
        )
        figures[f"{suite} / {policy}"] = {
            "hit_rate_affinity_over_least_loaded": round(affine["hit_rate"] / least["hit_rate"], 3)
            if least["hit_rate"]
            else None,
            "light_hit_rate_affinity_over_least_loaded": round(
                affine["light_hit_rate"] / least["light_hit_rate"], 3
            )
            if least["light_hit_rate"]
            else None,
            "light_ttft_p90_affinity_over_least_loaded": round(
                affine["light_ttft_p90_s"] / least["light_ttft_p90_s"], 3
            )
            if least["light_ttft_p90_s"]
            else None,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="draws of each suite, averaged")
    parser.add_argument("--quick", action="store_true", help="one seed")
    parser.add_argument("--part", choices=("simulator", "gateway", "all"), default="all")
    parser.add_argument("--speedup", type=float, default=5.0, help="gateway: time compression")
    parser.add_argument(
        "--gateway-seconds", type=float, default=120.0, help="gateway: seconds of each suite"
    )
    parser.add_argument("--slots", type=int, default=32, help="gateway: requests per upstream")
    parser.add_argument(
        "--upstream-policy",
        default="vtc",
        help="gateway: the upstreams' policy, or several, comma-separated (each a run)",
    )
    parser.add_argument(
        "--suites",
        default=",".join(LOCALITY_POOLS),
        help="gateway: comma-separated suites (system-prompt, multiturn, documents)",
    )
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    figures: dict[str, Any] = {"benchmark": "locality"}
    if args.part in ("simulator", "all"):
        figures["simulator"] = simulator_figures(seeds)
    if args.part in ("gateway", "all"):
        figures["gateway"] = gateway_figures(args)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
