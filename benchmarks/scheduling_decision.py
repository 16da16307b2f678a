"""Cost of one scheduling decision against the number of clients and waiting requests.

A decision is what the scheduler asks the policy for each admission: peek the next
request, pop it and charge its client (VTC: the smallest counter among backlogged
clients, O(log n)). A new arrival replaces it so the queue stays the same size.
Every client is backlogged. Prints one JSON line; compare ratios, not absolute times.

The locality-aware policies (vtc-lpm, vtc-hit, dlpm) run over a real prefix cache: every client
has a system prompt, half of them cached at the start (so arrivals and decisions look
their prefixes up). `*_with_cache_events_us` adds what the cache's changes cost them:
every tenth decision another client's prompt becomes cached, and its waiting requests'
prefixes grow.

`prefix_cycles` is the prefix-aware part alone, per waiting request: one client's
requests all wait on its system prompt (a thousand tokens) while a pool that holds
little more is taken by another request (the prompt evicted: every waiting request's
cached prefix falls to nothing) and freed, the prompt prefilled again (every one grows
back), the policy choosing after each. The waiting requests share one cached prefix,
so they are checked and moved as one group: a cycle's cost stays flat as they grow in
number, and its cost per waiting request falls.

    python benchmarks/scheduling_decision.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

from tokenfair.core.kv_cache import KVCacheManager
from tokenfair.core.policies import make_policy
from tokenfair.core.request import Request, SamplingParams

LOCALITY_POLICIES = ("vtc-lpm", "vtc-hit", "dlpm")
SYSTEM_PROMPT = 64  # tokens: four 16-token blocks


def make(i: int, client: str) -> Request:
    return Request(
        f"r{i}",
        client,
        input_tokens=100,
        arrival_s=float(i),
        sampling=SamplingParams(max_tokens=100),
        prefix_group=f"{client}/system",
        prefix_tokens=SYSTEM_PROMPT,
    )


def cache_system_prompt(kv: KVCacheManager, client: str) -> None:
    """Prefill `client`'s system prompt once and free it: its blocks stay cached."""
    request = Request(
        f"warm-{client}",
        client,
        input_tokens=SYSTEM_PROMPT,
        arrival_s=0.0,
        prefix_group=f"{client}/system",
        prefix_tokens=SYSTEM_PROMPT,
    )
    if kv.allocate(request, SYSTEM_PROMPT):
        request.num_computed_tokens = SYSTEM_PROMPT
        kv.cache_full_blocks(request)
        kv.free(request)


def decision_us(
    policy_name: str,
    clients: int,
    waiting: int,
    decisions: int,
    seed: int = 0,
    cache_events: bool = False,
) -> float:
    rng = random.Random(seed)
    policy = make_policy(policy_name)
    names = [f"c{i}" for i in range(clients)]
    kv = KVCacheManager(clients * 8, enable_prefix_caching=True)
    if policy_name in LOCALITY_POLICIES:
        policy.attach_prefix_cache(kv)
        for name in names[::2]:
            cache_system_prompt(kv, name)
    for i in range(waiting):
        policy.add(make(i, names[i % clients]), float(i))
    fresh = [make(waiting + i, names[rng.randrange(clients)]) for i in range(decisions)]
    # Decode charges land between decisions in a real server: a few running requests
    # of random clients gain tokens, so counters move as they would.
    running = [make(-1 - i, names[rng.randrange(clients)]) for i in range(32)]
    for r in running:
        policy.on_admit(r, True, 0.0)
    started = time.perf_counter()
    for i in range(decisions):
        request = policy.peek()
        policy.pop()
        policy.on_admit(request, True, 0.0)
        policy.add(fresh[i], 0.0)
        charged = running[i % 32]
        charged.append_output(1)
        policy.on_output(charged, 1)
        if cache_events and i % 10 == 0:
            cache_system_prompt(kv, names[rng.randrange(clients)])
    return (time.perf_counter() - started) / decisions * 1e6


CYCLE_PROMPT = 1024  # tokens of the system prompt in `prefix_cycles`: 64 blocks


def prefix_cycle_us(policy_name: str, waiting: int, cycles: int) -> float:
    """Microseconds per cycle of eviction and prefill again of the prompt that
    `waiting` requests of one client wait on, with a choice after each."""
    policy = make_policy(policy_name)
    blocks = CYCLE_PROMPT // 16 + 16
    kv = KVCacheManager(blocks, enable_prefix_caching=True)
    policy.attach_prefix_cache(kv)

    def prompt(request_id: str, tokens: int) -> Request:
        return Request(
            request_id,
            "c0",
            input_tokens=tokens,
            arrival_s=0.0,
            sampling=SamplingParams(max_tokens=100),
            prefix_group="c0/system",
            prefix_tokens=CYCLE_PROMPT,
        )

    for i in range(waiting):
        policy.add(prompt(f"r{i}", CYCLE_PROMPT + 50), 0.0)
    started = time.perf_counter()
    for i in range(cycles):
        filler = Request(f"filler-{i}", "c1", input_tokens=blocks * 16, arrival_s=0.0)
        kv.allocate(filler, blocks * 16)  # every idle block evicted, the prompt's too
        kv.free(filler)
        assert policy.peek() is not None
        warm = prompt(f"warm-{i}", CYCLE_PROMPT)
        kv.allocate(warm, CYCLE_PROMPT)
        warm.num_computed_tokens = CYCLE_PROMPT
        kv.cache_full_blocks(warm)  # every waiting request's prefix grows back
        kv.free(warm)
        assert policy.peek() is not None
    return (time.perf_counter() - started) / cycles * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions per point")
    args = parser.parse_args()
    decisions = 5_000 if args.quick else 50_000
    points = []
    for clients, waiting in [
        (10, 1_000),
        (100, 10_000),
        (1_000, 10_000),
        (10_000, 10_000),
        (10_000, 100_000),
    ]:
        row = {"clients": clients, "waiting": waiting}
        for name in ("fcfs", "vtc", *LOCALITY_POLICIES):
            row[f"{name}_us"] = round(
                min(decision_us(name, clients, waiting, decisions, s) for s in range(3)), 3
            )
        for name in LOCALITY_POLICIES:
            row[f"{name}_with_cache_events_us"] = round(
                min(decision_us(name, clients, waiting, decisions, s, True) for s in range(3)),
                3,
            )
        points.append(row)
    cycles = []
    for waiting in (100, 1_000, 10_000):
        row = {"waiting": waiting}
        for name in LOCALITY_POLICIES:
            cycle = min(prefix_cycle_us(name, waiting, 20 if args.quick else 100) for _ in range(3))
            row[f"{name}_cycle_us"] = round(cycle, 1)
            row[f"{name}_per_waiting_request_us"] = round(cycle / waiting, 4)
        cycles.append(row)
    vtc_small = points[0]["vtc_us"]
    vtc_large = points[3]["vtc_us"]
    figures = {
        "benchmark": "scheduling_decision",
        "points": points,
        "dlpm_us_at_1000_clients_10000_waiting": points[2]["dlpm_us"],
        "dlpm_with_cache_events_us_at_1000_clients_10000_waiting": points[2][
            "dlpm_with_cache_events_us"
        ],
        "vtc_lpm_us_at_1000_clients_10000_waiting": points[2]["vtc-lpm_us"],
        "vtc_hit_us_at_1000_clients_10000_waiting": points[2]["vtc-hit_us"],
        "vtc_hit_with_cache_events_us_at_1000_clients_10000_waiting": points[2][
            "vtc-hit_with_cache_events_us"
        ],
        "prefix_cycles": cycles,
        "vtc_lpm_cycle_us_at_10000_waiting": cycles[-1]["vtc-lpm_cycle_us"],
        "vtc_us_at_10000_clients": vtc_large,
        # log n grows 4x from 10 to 10,000 clients: a ratio under that is sub-logarithmic growth.
        "vtc_growth_10_to_10000_clients": round(vtc_large / vtc_small, 2),
        "log_growth_10_to_10000_clients": round(math.log(10_000) / math.log(10), 2),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
