"""What the gateway replicas' two Redis scripts cost Redis, at a fleet's size.

    .venv/bin/python benchmarks/redis_scripts.py [--baseline-src OTHER_TREE/src]
        [--replicas 4,16,64] [--tenants 32] [--upstreams 1] [--syncs 2000]

A real redis-server holds the state of `--replicas` gateway replicas (each with tenants
waiting, every upstream leased, every model claimed), then each replica in turn runs
the counters' merge (charges for 16 dispatches, as after `sync_every`) and the lease
sync, `--syncs` times each. Redis's own time per script, its commands included (INFO
commandstats), and the commands per script: what one Redis core can run a second, and
so how many replicas and requests it holds (docs/deploy.md). With `--baseline-src`,
the same from another tree's scripts, in the same Redis process, alternated.

Prints one JSON line per tree and fleet size, then a summary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gateway.redis_server import RedisServer  # noqa: E402


def scripts_of(src: Path) -> tuple[ModuleType, ModuleType]:
    """The counters' and the leases' script modules of the tree at `src`."""
    for name in [m for m in sys.modules if m.startswith("tokenfair")]:
        del sys.modules[name]
    sys.path.insert(0, str(src))
    try:
        return (
            importlib.import_module("tokenfair.gateway.replicas.lua"),
            importlib.import_module("tokenfair.gateway.replicas.lease_script"),
        )
    finally:
        sys.path.remove(str(src))


def claim(leases: ModuleType, slots: int, nodes: dict[str, float]) -> str:
    try:
        return str(leases.claim_text(0, slots, 10 * slots, nodes))
    except TypeError:  # a tree whose claims carry the best counter too
        return str(leases.claim_text((0, 1.0), slots, 10 * slots, nodes))


def fleet(
    client: Any, src: Path, namespace: str, replicas: int, tenants: int, upstreams: int, syncs: int
) -> dict[str, Any]:
    counters_lua, leases = scripts_of(src)
    merge = client.register_script(counters_lua.SYNC)
    lease = client.register_script(leases.SYNC)
    urls = [f"http://10.0.0.{u}:8000" for u in range(upstreams)]
    ids = [f"g{r}" for r in range(replicas)]
    # Each replica's tenants: its share of them, waiting there.
    mine = {g: [f"t{t}" for t in range(tenants) if t % replicas == r] for r, g in enumerate(ids)}

    def merge_args(g: str) -> list[Any]:
        names = mine[g] or ["t0"]
        charged = [names[i % len(names)] for i in range(16)]
        args: list[Any] = [namespace, g, 5000, len(charged)]
        for node in charged:
            args.extend((node, "", "12.5"))
        args.extend(("\n".join(names), names[0]))
        return args

    def lease_args(g: str, give_back: bool) -> list[Any]:
        args: list[Any] = [namespace, g, 5000, 1 if give_back else 0, 1000, len(urls)]
        for url in urls:
            args.extend((url, 4 * replicas, 0, 8, 80, 2, 0, 1, "m"))
        nodes = {t: 1.0 for t in mine[g]} or {"t0": 1.0}
        args.extend((1, "m", claim(leases, 8, nodes)))
        return args

    for g in ids:  # the fleet settled
        merge(args=merge_args(g))
        lease(args=lease_args(g, False))
    out: dict[str, Any] = {"replicas": replicas, "tenants": tenants, "upstreams": upstreams}
    for name, run in (
        ("merge", lambda i: merge(args=merge_args(ids[i % replicas]))),
        ("lease_sync", lambda i: lease(args=lease_args(ids[i % replicas], i % 4 == 0))),
    ):
        client.config_resetstat()
        for i in range(syncs):
            run(i)
        stats = client.info("commandstats")
        script = stats["cmdstat_evalsha"]
        inner = sum(
            int(v["calls"])
            for k, v in stats.items()
            if k not in ("cmdstat_info", "cmdstat_config|resetstat")
        )
        out[f"{name}_us"] = round(float(script["usec_per_call"]), 1)
        out[f"{name}_commands"] = round(inner / syncs, 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="another tree's src, run alongside")
    parser.add_argument("--replicas", default="4,16,64")
    parser.add_argument("--tenants", type=int, default=32)
    parser.add_argument("--upstreams", type=int, default=1)
    parser.add_argument("--syncs", type=int, default=2000)
    args = parser.parse_args()
    trees = {"this": ROOT / "src"}
    if args.baseline_src:
        trees["baseline"] = args.baseline_src.resolve()
    summary: dict[str, dict[str, Any]] = {name: {} for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            client = redis.Redis.from_url(server.url)
            for replicas in (int(r) for r in args.replicas.split(",")):
                for name, src in trees.items():  # alternated: the machine's noise hits both
                    client.flushall()
                    result = fleet(
                        client, src, f"bench-{name}", replicas, args.tenants,
                        args.upstreams, args.syncs,
                    )  # fmt: skip
                    print(json.dumps({"tree": name, **result}))
                    summary[name][str(replicas)] = {
                        k: v for k, v in result.items() if k.endswith(("_us", "_commands"))
                    }
        finally:
            server.stop()
    print(json.dumps({"summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
