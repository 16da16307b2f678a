"""Prefix hit rate and TTFT through the gateway: least-loaded vs prefix-affinity routing.

    nice -n 10 .venv/bin/python benchmarks/gateway_prefix_routing.py [--seconds 40]

Three `tokenfair serve --model sim:PROFILE --enable-prefix-caching` upstreams (a KV pool
of `--kv-tokens` each, so cached prefixes compete for room), fresh for each routing
mode, behind one gateway (vtc; tenants from the `user` field, which the upstreams also
use, so their caches are salted per tenant as in production). The workload: each
tenant has its own system prompt (`--system-tokens`) and keeps conversations going
(one heavy tenant with `--heavy` at once, `--light` light tenants with one each), each
conversation a closed loop of turns where turn k's prompt is the whole conversation so
far plus a new message (`--message-tokens` of text, a pasted excerpt), sent after the
user's think time (exponential, mean `--think-s`: without it a closed loop's next turn
finds the very slot its previous turn just freed, and least-loaded routing looks
sticky by accident); a conversation ends after `--turns` turns and a new one starts.
Sim prompts are 4 bytes a token.

Per mode it prints one JSON line: the upstreams' own prefix hit rate
(tokenfair:prefix_cache_hits / queries, in tokens), the gateway's estimate
(matched / routed blocks), routing decisions by reason, requests per upstream,
client-measured TTFT p50/p90 for the heavy and the light tenants, and throughput; then a
summary line with prefix-affinity over least-loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gateway.processes import Process, gateway, metrics, sim_upstream  # noqa: E402

WORDS = [
    "clause",
    "tax",
    "filing",
    "deadline",
    "exemption",
    "business",
    "income",
    "report",
    "form",
    "article",
    "annex",
    "schedule",
    "penalty",
    "refund",
    "credit",
    "deduction",
    "threshold",
    "quarter",
    "year",
    "rate",
    "amount",
]


def _system(tenant: str, tokens: int) -> str:
    line = f"You are the assistant of {tenant}; follow its style guide and cite sources. "
    return (line * (4 * tokens // len(line) + 1))[: 4 * tokens]


def _message(rng: random.Random, tokens: int) -> str:
    """A pasted excerpt of about `tokens` tokens, different every time."""
    words: list[str] = []
    size = 0
    while size < 4 * tokens:
        words.append(rng.choice(WORDS))
        size += len(words[-1]) + 1
    return "Explain this excerpt: " + " ".join(words)


def _pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


async def _turn(
    http: httpx.AsyncClient, url: str, tenant: str, messages: list[dict[str, str]], tokens: int
) -> tuple[float, str]:
    """One streamed turn: (TTFT seconds, the reply's text)."""
    start = time.perf_counter()
    first = 0.0
    text: list[str] = []
    body = {
        "model": "sim",
        "messages": messages,
        "max_tokens": tokens,
        "stream": True,
        "user": tenant,
    }
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or []
            content = choices[0].get("delta", {}).get("content") if choices else None
            if content:
                if not first:
                    first = time.perf_counter()
                text.append(content)
    return (first or time.perf_counter()) - start, "".join(text)


async def _conversations(
    url: str, tenant: str, until: float, args: argparse.Namespace, seed: int, out: list[Any]
) -> None:
    """One closed loop of conversations for `tenant`."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=300) as http:
        while time.perf_counter() < until:
            messages = [{"role": "system", "content": _system(tenant, args.system_tokens)}]
            for _ in range(args.turns):
                if time.perf_counter() >= until:
                    return
                messages.append({"role": "user", "content": _message(rng, args.message_tokens)})
                ttft, reply = await _turn(http, url, tenant, messages, args.tokens)
                out.append((tenant, ttft, args.tokens))
                messages.append({"role": "assistant", "content": reply})
                await asyncio.sleep(rng.expovariate(1 / args.think_s) if args.think_s else 0)


def _cache(upstreams: list[Process]) -> tuple[float, float]:
    hits = queries = 0.0
    for upstream in upstreams:
        values = metrics(upstream)
        hits += values.get(("tokenfair:prefix_cache_hits_total", ()), 0.0)
        queries += values.get(("tokenfair:prefix_cache_queries_total", ()), 0.0)
    return hits, queries


def _gateway_routing(gw: Process) -> dict[str, Any]:
    values = metrics(gw)
    reasons: dict[str, float] = {}
    per_upstream: dict[str, float] = {}
    blocks = matched = 0.0
    for (name, labels), value in values.items():
        label = dict(labels)
        if name == "tokenfair:gateway_route_decisions_total":
            reasons[label["reason"]] = reasons.get(label["reason"], 0) + value
            per_upstream[label["upstream"]] = per_upstream.get(label["upstream"], 0) + value
        elif name == "tokenfair:gateway_prefix_blocks_total":
            blocks += value
        elif name == "tokenfair:gateway_prefix_matched_blocks_total":
            matched += value
    return {
        "decisions": {k: int(v) for k, v in reasons.items() if v},
        "requests_per_upstream": {k: int(v) for k, v in sorted(per_upstream.items())},
        "estimated_hit_rate": round(matched / blocks, 3) if blocks else None,
    }


def _run_mode(mode: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    options = [
        "--enable-prefix-caching",
        "--tenant-from-user",
        "--kv-tokens",
        str(args.kv_tokens),
        "--max-num-seqs",
        str(args.slots),
    ]
    names = [f"{mode}-sim{i}" for i in range(3)]
    upstreams = [sim_upstream(tmp, name, *options, profile=args.profile) for name in names]
    gw = None
    try:
        configs = [
            {"url": u.url, "models": ["sim"], "max_concurrent": args.slots, "name": f"sim{i}"}
            for i, u in enumerate(upstreams)
        ]
        gw = gateway(
            tmp,
            configs,
            name=f"gateway-{mode}",
            routing=mode,
            tenants=None,
            tenant_from_user=True,
            max_waiting=100000,
        )
        tenants = {"heavy": args.heavy, **{f"light{i}": 1 for i in range(args.light)}}
        out: list[tuple[str, float, int]] = []

        async def load() -> None:
            until = time.perf_counter() + args.seconds
            await asyncio.gather(
                *(
                    _conversations(gw.url, tenant, until, args, seed, out)
                    for seed, (tenant, count) in enumerate(
                        (t, c) for t, n in tenants.items() for c in range(n)
                    )
                )
            )

        start = time.perf_counter()
        asyncio.run(load())
        elapsed = time.perf_counter() - start
        hits, queries = _cache(upstreams)
        heavy = [ttft for tenant, ttft, _ in out if tenant == "heavy"]
        light = [ttft for tenant, ttft, _ in out if tenant != "heavy"]
        return {
            "routing": mode,
            "requests": len(out),
            "hit_rate": round(hits / queries, 3) if queries else None,
            "prompt_tokens": int(queries),
            **_gateway_routing(gw),
            "ttft_heavy_p50_s": _round(_pct(heavy, 0.5)),
            "ttft_heavy_p90_s": _round(_pct(heavy, 0.9)),
            "ttft_light_p50_s": _round(_pct(light, 0.5)),
            "ttft_light_p90_s": _round(_pct(light, 0.9)),
            "output_tokens_per_s": round(sum(n for _, _, n in out) / elapsed, 1),
        }
    finally:
        if gw is not None:
            gw.stop()
        for upstream in upstreams:
            upstream.stop()


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--profile", default="a10g-llama-7b", help="sim profile of the upstreams")
    parser.add_argument("--kv-tokens", type=int, default=24000, help="each upstream's KV pool")
    parser.add_argument("--slots", type=int, default=8, help="requests at once per upstream")
    parser.add_argument("--heavy", type=int, default=16, help="the heavy tenant's conversations")
    parser.add_argument("--light", type=int, default=6, help="light tenants, one conversation each")
    parser.add_argument("--system-tokens", type=int, default=1200)
    parser.add_argument("--message-tokens", type=int, default=300)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=48, help="reply length")
    parser.add_argument("--think-s", type=float, default=2.0, help="mean think time per turn")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="prefix-routing-bench-"))
    try:
        results = {}
        for mode in ("least-loaded", "prefix-affinity"):
            results[mode] = _run_mode(mode, args, tmp)
            print(json.dumps(results[mode]), flush=True)
        least, affine = results["least-loaded"], results["prefix-affinity"]
        summary: dict[str, Any] = {"summary": True, **{k: v for k, v in vars(args).items()}}
        for field in ("hit_rate", "ttft_light_p90_s", "ttft_heavy_p90_s", "output_tokens_per_s"):
            if least.get(field) and affine.get(field) is not None:
                summary[f"{field}_affinity_over_least_loaded"] = round(
                    affine[field] / least[field], 3
                )
        print(json.dumps(summary), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
