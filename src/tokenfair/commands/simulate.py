"""`tokenfair simulate`: replay a trace through the real scheduler on a virtual clock.

The two presets differ in every setting that decides what a run shows, so each one's
defaults are spelled out in --help and the settings used are printed with the summary.
The engine preset has no default KV pool: a real engine's pool is what the GPU's memory
leaves after the weights, which the step-time profile does not say, and a pool too
large to ever fill makes every policy look the same.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from tokenfair.commands.common import (
    SHARE_MEMORY_HELP,
    STEP_SHARE_HELP,
    check_output_file,
    check_weights,
    fail,
    load_profile_option,
    read_shares_file,
    read_trace_file,
    user_errors,
    warn,
)
from tokenfair.core.policies import make_policy
from tokenfair.core.scheduler import ConfigError, SchedulerConfig
from tokenfair.core.scheduler_config import PAPER_KV_TOKENS
from tokenfair.results import ResultRecord, write_results
from tokenfair.workloads.trace import TraceRecord

PRESETS = ("paper", "engine")
# Warn when recompute/swap preemptions exceed this share of requests.
PREEMPTION_WARNING_SHARE = 0.1

PRESET_HELP = (
    "paper: the paper's router (reserve admission, prompts prefilled in steps of their "
    "own, admission every 10 decode steps, per-token KV, 10,000-token pool); engine: "
    "vLLM-like (optimistic admission, fused chunked prefill, 16-token blocks, "
    "preemption; --kv-tokens required)."
)
# The system a run simulates, as `simulate` and `experiment compare` take it.
PresetOption = Annotated[str, typer.Option(help=PRESET_HELP)]
KvTokensOption = Annotated[
    int | None, typer.Option(help="KV pool in tokens. paper: 10,000; engine: required.", min=1)
]
PrefixCachingOption = Annotated[
    bool | None,
    typer.Option(
        "--prefix-caching/--no-prefix-caching",
        help="Reuse cached prompt prefixes (trace prefix_group/prefix_tokens). "
        "paper: off (its system had none); engine: on (as vLLM).",
    ),
]


def build_config(
    preset: str,
    kv_tokens: int | None,
    admission: str | None,
    preemption: str | None,
    swap_tokens: int | None,
    max_num_seqs: int | None,
    max_batched_tokens: int | None,
    prefix_caching: bool | None = None,
    share_seats: bool | None = None,
    share_memory: bool | None = None,
    step_share_tokens: int | None = None,
) -> SchedulerConfig:
    """The scheduler settings of a preset with the options given on top."""
    if preset not in PRESETS:
        fail(f"--preset {preset!r}: expected 'paper' or 'engine'")
    if preset == "engine" and kv_tokens is None:
        fail(
            "--preset engine needs --kv-tokens: the KV pool in tokens, i.e. what the GPU's "
            "memory holds after the weights (e.g. 24 GB A10G - 13.5 GB Llama-2-7B at "
            "512 KiB/token: about 20,000)"
        )
    if preemption == "swap" and swap_tokens is None:
        # A CPU swap area as large as the GPU pool: room to swap out every running
        # request once (vLLM sizes its swap space in GiB of host memory likewise).
        swap_tokens = kv_tokens if kv_tokens is not None else PAPER_KV_TOKENS
    settings: dict[str, object] = {
        key: value
        for key, value in {
            "admission": admission,
            "preemption": preemption,
            "swap_tokens": swap_tokens,
            "max_num_seqs": max_num_seqs,
            "max_batched_tokens": max_batched_tokens,
            "enable_prefix_caching": prefix_caching,
            "share_seats": share_seats,
            "share_memory": share_memory,
            "step_share_tokens": step_share_tokens,
        }.items()
        if value is not None
    }
    if step_share_tokens == 0:
        settings["step_share_tokens"] = None  # no limit
    if swap_tokens and preemption != "swap":
        warn("--swap-tokens has no effect without --preemption swap")
    try:
        return SchedulerConfig.preset(preset, kv_tokens, **settings)
    except (ConfigError, TypeError) as error:
        fail(name_options(str(error)))


def name_options(message: str) -> str:
    """A scheduler setting's message, speaking of the command-line options."""
    return re.sub(
        r"\b(kv_tokens|swap_tokens|max_num_seqs|max_batched_tokens|admission|preemption)\b",
        lambda match: "--" + match.group(1).replace("_", "-"),
        message,
    )


def rejection_warning(
    results: Sequence[ResultRecord], trace: Sequence[TraceRecord], config: SchedulerConfig
) -> str | None:
    """Say how many requests were rejected and why, or None when none were."""
    rejected = [r for r in results if r.finish_reason == "rejected"]
    if not rejected:
        return None
    by_id = {t.request_id: t for t in trace}
    per_block = config.block_size
    capacity = (config.kv_tokens // per_block) * per_block

    def need(request_id: str) -> int:
        record = by_id[request_id]
        return math.ceil((record.input_tokens + record.length_limit) / per_block) * per_block

    never = [r for r in rejected if need(r.request_id) > capacity]
    parts = []
    if never:
        largest = max(need(r.request_id) for r in never)
        parts.append(
            f"{len(never):,} can never fit in the {config.kv_tokens:,}-token KV pool "
            f"(prompt + max_tokens; the largest needs {largest:,} tokens: raise --kv-tokens)"
        )
    if len(never) < len(rejected):
        parts.append(f"{len(rejected) - len(never):,} refused by the policy (rate limit)")
    return f"{len(rejected):,} of {len(results):,} requests rejected: " + "; ".join(parts)


def prefix_hit_rate(served: Sequence[ResultRecord]) -> float:
    """The share of served requests' prompt tokens found in the prefix cache."""
    prompts = sum(r.input_tokens for r in served)
    return round(sum(r.cached_tokens for r in served) / prompts, 4) if prompts else 0.0


def simulate(
    trace: Annotated[Path, typer.Option(help="Trace file (JSONL, one request a line).")],
    policy: Annotated[
        str,
        typer.Option(
            help="Scheduling policy, e.g. fcfs, vtc, rpm:20, or your own: "
            "mypkg.mod:MyPolicy(key=value) (tokenfair policies lists them)."
        ),
    ] = "vtc",
    profile: Annotated[
        str, typer.Option(help="Step-time profile: a shipped name (tokenfair profiles) or JSON.")
    ] = "a10g-llama-7b",
    preset: PresetOption = "paper",
    kv_tokens: KvTokensOption = None,
    admission: Annotated[
        str | None, typer.Option(help="reserve | optimistic. paper: reserve; engine: optimistic.")
    ] = None,
    preemption: Annotated[
        str | None,
        typer.Option(
            help="recompute | swap (both presets: recompute; reserve admission never preempts)."
        ),
    ] = None,
    swap_tokens: Annotated[
        int | None,
        typer.Option(
            help="CPU swap area in tokens (with --preemption swap: the pool's size).", min=0
        ),
    ] = None,
    max_num_seqs: Annotated[
        int | None,
        typer.Option(help="Most requests running at once. paper: 1000; engine: 256.", min=1),
    ] = None,
    max_batched_tokens: Annotated[
        int | None,
        typer.Option(help="Most tokens per step. paper: max(pool / 6, 3072); engine: 8192.", min=1),
    ] = None,
    weights: Annotated[
        Path | None,
        typer.Option(
            help="JSON {client: weight, 0.01 to 100}, or a tree of groups with weights (docs/fairness.md),"
            " for wvtc and the VTC family."
        ),
    ] = None,
    cost: Annotated[
        str, typer.Option(help="Counter cost: linear (w_in=1, w_out=2) or profiled.")
    ] = "linear",
    prefix_caching: PrefixCachingOption = None,
    charge_cached_tokens: Annotated[
        float,
        typer.Option(
            help="What a prompt token served from the prefix cache costs a client, as a "
            "share of a computed one: 1 the prompt as sent (the paper's cost), 0 only "
            "what is computed.",
            min=0.0,
            max=1.0,
        ),
    ] = 1.0,
    share_seats: Annotated[
        bool | None,
        typer.Option(
            "--share-seats/--no-share-seats",
            help="With every seat taken, a tenant over its weighted share of the seats gives "
            "one up to a tenant waiting for one (VTC policies). paper: off; engine: on.",
        ),
    ] = None,
    share_memory: Annotated[
        bool | None,
        typer.Option(
            "--share-memory/--no-share-memory", help=SHARE_MEMORY_HELP + " paper: off; engine: on."
        ),
    ] = None,
    step_share_tokens: Annotated[
        int | None,
        typer.Option(
            help=STEP_SHARE_HELP + " paper: none (prompts in steps of their own); engine: 768.",
            min=0,
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write per-request results (JSONL) here.")
    ] = None,
) -> None:
    """Replay a trace through the real scheduler on a virtual clock.

    Prints one JSON summary (with the settings used); warnings (rejections,
    preemptions, weights) go to stderr.

    \b
    Example: tokenfair simulate --trace ../shared/traces/arena_vtc_600s.jsonl --policy vtc --out vtc.jsonl
    """
    from tokenfair.core.cost import make_cost
    from tokenfair.engine.sim.simulator import simulate as run_simulation

    check_output_file(out)
    config = build_config(
        preset,
        kv_tokens,
        admission,
        preemption,
        swap_tokens,
        max_num_seqs,
        max_batched_tokens,
        prefix_caching,
        share_seats,
        share_memory,
        step_share_tokens,
    )
    records = read_trace_file(trace)
    step_profile = load_profile_option(profile)
    shares = read_shares_file(weights)
    client_weights = shares.client_weights() if shares is not None else None
    with user_errors():
        chosen = make_policy(
            policy,
            weights=shares.weights if shares is not None else None,
            cost=make_cost(cost),
            charge_cached_tokens=charge_cached_tokens,
            tree=shares.tree if shares is not None else None,
        )
    check_weights(client_weights, {r.client for r in records}, [policy])
    started = time.perf_counter()
    result = run_simulation(records, chosen, step_profile, config)
    wall = time.perf_counter() - started
    if out is not None:
        with user_errors():
            write_results(result.results, out)
    served = [r for r in result.results if r.served]
    tokens = sum(r.input_tokens + r.output_tokens for r in served)
    summary = {
        "policy": chosen.name,
        "requests": len(result.results),
        "served": len(served),
        "rejected": sum(r.finish_reason == "rejected" for r in result.results),
        "makespan_s": round(result.makespan_s, 3),
        "throughput_tok_s": round(tokens / result.makespan_s, 2) if result.makespan_s else 0.0,
        "steps": result.steps,
        "preemptions": result.preemptions,
        "swaps": result.swaps,
        "preemptions_by_client": result.preemptions_by_client,
        "policy_preemptions": result.policy_preemptions,
        "prefix_hit_rate": prefix_hit_rate(served) if config.enable_prefix_caching else None,
        "wall_s": round(wall, 3),
        "out": str(out) if out else None,
        "preset": preset,
        "profile": step_profile.name,
        "config": asdict(config),
    }
    rejected = rejection_warning(result.results, records, config)
    if rejected:
        warn(rejected)
    if result.memory_preemptions > PREEMPTION_WARNING_SHARE * len(result.results):
        by_client = result.memory_preemptions_by_client
        worst = max(by_client, key=by_client.__getitem__)
        warn(
            f"{result.memory_preemptions} preemptions under memory pressure for "
            f"{len(result.results)} requests (most for {worst}): a sizing problem; give the "
            "KV pool more tokens or lower --max-num-seqs"
        )
    print(json.dumps(summary))
