"""vLLM's OpenAI server with and without tokenfair's scheduler plugin, side by side.

Two scenarios, each against stock vLLM (FCFS) and vLLM with
`--scheduler-cls tokenfair.integrations.vllm.FairScheduler` (VTC), on a random Llama
(hidden 256, 4 layers, vocab 1024) on vLLM's CPU build, one server per mode:

- flood: for `--flood-s` seconds a heavy tenant keeps `--flood` requests outstanding
  (64 in, 64 out; each one that ends is replaced) while a light tenant sends one
  request at a time (16 in, 8 out). Light TTFT
  p90 and output tok/s; greedy outputs of every request compared between the modes;
- arena: the paper's trace (shared/traces/arena_vtc_600s.jsonl, 27 clients) replayed
  in real time: a seeded `--sample` of its requests (every client keeps its arrival
  pattern at that share of its rate), times scaled by `--time-scale`, lengths by
  `--length-scale`, so that a CPU server is overloaded about as the paper's A10G was;
  the KV cache limited to `--kv-tokens`. Max/Avg Diff (SPEC section 6, computed by tokenfair's
  own metrics on the recorded results, over the same time-scaled ticks and window)
  and throughput. The trace's client ids name the tenants.
- long, mix (on servers of their own: an 8,192-token context and a KV pool holding
  four `--long-prompt`-token prompts): `--long-streams` streams of long prompts
  (6,144 in, 32 out; each stream sends its next one when the last ends) beside a chat
  tenant sending one request (64 in, 32 out) every 0.5 s (`long`), or two long
  tenants with that many streams each beside two such chat tenants (`mix`), for
  `--long-s` seconds. The chat tenants' TTFT p99 against the chat tenant alone (its
  own requests on stock vLLM), their TPOT p50, and the long tenants' prompt and
  output tokens per second, under stock vLLM, the plugin (`vtc`) and, with
  `--before-src DIR`, the plugin from another tree (DIR/src: the plugin before a
  change).

Prints one JSON line per scenario; per-request results go to out/vllm_plugin/.
Run from the main environment (it needs tokenfair's metrics); vLLM runs from
.venv-vllm with PYTHONPATH=src. Takes ~10 minutes on 2 busy cores:

    nice -n 10 .venv/bin/python benchmarks/vllm_plugin.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from tokenfair.fairness.report import fairness_report
from tokenfair.results import ResultRecord

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("TOKENFAIR_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
OUT = ROOT / "out" / "vllm_plugin"
MODEL = "tiny"
VOCAB = 1024
HEAVY = (64, 64)  # flood requests: prompt and output tokens
LIGHT = (16, 8)
LONG_OUTPUT = 32  # long-neighbour requests' output tokens
CHAT = (64, 32)  # chat requests: prompt and output tokens
CHAT_EVERY_S = 0.5


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def prompt(length: int, rng: random.Random) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(length)]


class Server:
    def __init__(
        self,
        model_dir: Path,
        plugin: bool,
        args: argparse.Namespace,
        log: Path,
        *,
        src: Path = ROOT / "src",
        kv_tokens: int | None = None,
        max_model_len: int = 2048,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        block = 32
        kv_tokens = args.kv_tokens if kv_tokens is None else kv_tokens
        command = [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(max_model_len), "--dtype", "float32", "--enforce-eager",
            "--max-num-seqs", str(args.max_num_seqs), "--no-enable-prefix-caching",
            "--block-size", str(block),
            "--num-gpu-blocks-override", str(-(-kv_tokens // block)),
        ]  # fmt: skip
        if plugin:
            settings = {"tokenfair": {"policy": "vtc", "log_interval_s": 30}}
            command += ["--scheduler-cls", "tokenfair.integrations.vllm.FairScheduler"]
            command += ["--additional-config", json.dumps(settings)]
        env = dict(
            os.environ,
            PYTHONPATH=str(src),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_HOST_IP="127.0.0.1",
            VLLM_CPU_KVCACHE_SPACE="2",
            VLLM_CACHE_ROOT=str(OUT / "vllm-cache"),
            HF_HOME=str(OUT / "hf-home"),
        )
        self.log = log
        self.process = subprocess.Popen(
            command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT
        )

    def wait_healthy(self, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"vLLM server exited:\n{tail}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise SystemExit(f"vLLM server not healthy after {timeout_s} s (log: {self.log})")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


async def stream(
    client: openai.AsyncOpenAI,
    request_id: str,
    tenant: str,
    tokens: list[int],
    output: int,
    start: float,
    results: list[dict[str, Any]],
) -> None:
    arrival = time.monotonic() - start
    first = None
    text = []
    response = await client.completions.create(
        model=MODEL,
        prompt=tokens,
        max_tokens=output,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True, "vllm_xargs": {"tenant": tenant}},
        extra_headers={"X-Request-Id": request_id},
    )
    async for chunk in response:
        if chunk.choices and chunk.choices[0].text:
            if first is None:
                first = time.monotonic() - start
            text.append(chunk.choices[0].text)
    finish = time.monotonic() - start
    results.append(
        {
            "request_id": request_id,
            "client": tenant,
            "arrival_s": arrival,
            "input_tokens": len(tokens),
            "output_tokens": output,
            "first_token_s": first if first is not None else finish,
            "finish_s": finish,
            "text": "".join(text),
        }
    )


def make_client(url: str) -> openai.AsyncOpenAI:
    # openai's own HTTP client: up to 1,000 connections, more than the replay keeps open.
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)


async def flood(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The heavy tenant keeps `--flood` requests outstanding for `--flood-s` seconds
    (each one that ends is replaced); the light tenant sends its next request when the
    previous one ends, for as long."""
    client = make_client(url)
    results: list[dict[str, Any]] = []
    start = time.monotonic()
    end = start + args.flood_s
    counter = iter(range(1_000_000))

    async def heavy_loop() -> None:
        while time.monotonic() < end:
            i = next(counter)
            tokens = prompt(HEAVY[0], random.Random(f"heavy-{i}"))
            await stream(client, f"heavy-{i}", "heavy", tokens, HEAVY[1], start, results)

    async def light_loop() -> None:
        i = 0
        while time.monotonic() < end:
            tokens = prompt(LIGHT[0], random.Random(f"light-{i}"))
            await stream(client, f"light-{i}", "light", tokens, LIGHT[1], start, results)
            i += 1

    await asyncio.gather(*(heavy_loop() for _ in range(args.flood)), light_loop())
    await client.close()
    return results


async def arena(
    url: str, trace: list[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    client = make_client(url)
    rng = random.Random(2)
    results: list[dict[str, Any]] = []
    start = time.monotonic()
    tasks = []
    for i, row in enumerate(trace):
        delay = row["arrival_s"] * args.time_scale - (time.monotonic() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        tokens = prompt(max(1, math.ceil(row["input_tokens"] * args.length_scale)), rng)
        output = max(1, math.ceil(row["output_tokens"] * args.length_scale))
        tasks.append(
            asyncio.create_task(
                stream(client, f"arena-{i}", str(row["client"]), tokens, output, start, results)
            )
        )
    await asyncio.gather(*tasks)
    await client.close()
    return results


def records(results: list[dict[str, Any]]) -> list[Any]:
    fields = ("request_id", "client", "arrival_s", "input_tokens", "output_tokens")
    return [
        ResultRecord(
            **{k: r[k] for k in fields},
            scheduled_s=r["arrival_s"],
            first_token_s=r["first_token_s"],
            finish_s=r["finish_s"],
            finish_reason="length",
        )
        for r in results
    ]


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def output_tok_s(results: list[dict[str, Any]]) -> float:
    wall = max(r["finish_s"] for r in results) - min(r["arrival_s"] for r in results)
    return sum(r["output_tokens"] for r in results) / wall


def flood_figures(results: list[dict[str, Any]]) -> dict[str, float]:
    light = [r["first_token_s"] - r["arrival_s"] for r in results if r["client"] == "light"]
    return {
        "light_requests": len(light),
        "light_ttft_p90_s": round(p90(light), 3),
        "light_ttft_p50_s": round(statistics.median(light), 3),
        "output_tok_s": round(output_tok_s(results), 1),
    }


def arena_figures(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, float]:
    scale = args.time_scale
    report: Any = fairness_report(
        records(results), duration_s=600 * scale, window_s=60 * scale, warmup_s=30 * scale
    )

    def get(key: str) -> float:
        return float(report[key] if isinstance(report, dict) else getattr(report, key))

    return {
        "max_diff": round(get("max_diff"), 2),
        "avg_diff": round(get("avg_diff"), 2),
        "throughput_tok_s": round(get("throughput_tok_s"), 1),
        "output_tok_s": round(output_tok_s(results), 1),
    }


async def long_neighbour(
    url: str, long_tenants: int, chat_tenants: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """`long_tenants` tenants keep `--long-streams` long prompts each outstanding (each
    stream sends its next one when the last ends) while `chat_tenants` tenants each send
    a chat request every 0.5 s, for `--long-s` seconds; every request is awaited."""
    client = make_client(url)
    results: list[dict[str, Any]] = []
    start = time.monotonic()
    end = start + args.long_s
    counter = iter(range(1_000_000))

    async def long_stream(tenant: str) -> None:
        while time.monotonic() < end:
            i = next(counter)
            tokens = prompt(args.long_prompt, random.Random(f"{tenant}-{i}"))
            await stream(client, f"{tenant}-{i}", tenant, tokens, LONG_OUTPUT, start, results)

    async def chat(tenant: str, offset_s: float) -> None:
        tasks = []
        for i in range(int(args.long_s / CHAT_EVERY_S)):
            delay = offset_s + i * CHAT_EVERY_S - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            tokens = prompt(CHAT[0], random.Random(f"{tenant}-{i}"))
            request = stream(client, f"{tenant}-{i}", tenant, tokens, CHAT[1], start, results)
            tasks.append(asyncio.create_task(request))
        await asyncio.gather(*tasks)

    loads = [
        long_stream(f"long-{t}") for t in range(long_tenants) for _ in range(args.long_streams)
    ]
    # The chat tenants' requests interleave (a quarter of the period apart).
    loads += [chat(f"chat-{t}", 0.1 + t * CHAT_EVERY_S / 4) for t in range(chat_tenants)]
    await asyncio.gather(*loads)
    await client.close()
    return results


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def chat_figures(results: list[dict[str, Any]]) -> dict[str, float]:
    chat = [r for r in results if r["client"].startswith("chat")]
    ttft = [r["first_token_s"] - r["arrival_s"] for r in chat]
    tpot = [(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in chat]
    return {
        "chat_requests": len(chat),
        "chat_ttft_p50_s": round(statistics.median(ttft), 4),
        "chat_ttft_p99_s": round(percentile(ttft, 0.99), 4),
        "chat_tpot_p50_s": round(statistics.median(tpot), 5),
    }


def long_figures(results: list[dict[str, Any]]) -> dict[str, float]:
    """The chat figures, and the long tenants' prompt and output tokens per second over
    the run (every long request sent was served to its end)."""
    long = [r for r in results if r["client"].startswith("long")]
    wall = max(r["finish_s"] for r in results) - min(r["arrival_s"] for r in results)
    tokens = sum(r["input_tokens"] + r["output_tokens"] for r in long)
    return {
        **chat_figures(results),
        "long_requests": len(long),
        "long_tok_s": round(tokens / wall, 1),
    }


def run_long_scenarios(model_dir: Path, args: argparse.Namespace, names: list[str]) -> None:
    """The long-neighbour scenarios, each mode on a server of its own (an 8,192-token
    context, a pool holding four long prompts): stock (and the chat tenant alone on it),
    the plugin, and with `--before-src` the plugin from that tree."""
    shapes = {"long": (1, 1), "mix": (2, 2)}  # long tenants, chat tenants
    kv_tokens = 4 * (args.long_prompt + 2 * LONG_OUTPUT)
    modes = [("stock", None), ("plugin", ROOT / "src")]
    if args.before_src is not None:
        modes.append(("before", args.before_src / "src"))
    if args.plugin_first:
        modes.reverse()
    figures: dict[str, dict[str, Any]] = {name: {} for name in names}
    for mode, src in modes:
        server = Server(
            model_dir,
            src is not None,
            args,
            OUT / f"server-long-{mode}.log",
            src=src or ROOT / "src",
            kv_tokens=kv_tokens,
            max_model_len=8192,
        )
        try:
            server.wait_healthy()
            if mode == "stock":
                alone = asyncio.run(long_neighbour(server.url, 0, 1, args))
                save(alone, "alone", "stock")
                figures["alone"] = chat_figures(alone)
            for name in names:
                long_tenants, chat_tenants = shapes[name]
                results = asyncio.run(long_neighbour(server.url, long_tenants, chat_tenants, args))
                save(results, name, mode)
                figures[name][mode] = long_figures(results)
        finally:
            server.stop()
    alone = figures["alone"]
    for name in names:
        runs = figures[name]
        for run in runs.values():
            run["chat_ttft_p99_vs_alone"] = round(
                run["chat_ttft_p99_s"] / alone["chat_ttft_p99_s"], 1
            )
            run["long_tok_s_vs_stock"] = round(run["long_tok_s"] / runs["stock"]["long_tok_s"], 3)
        print(
            json.dumps(
                {
                    "benchmark": "vllm_plugin",
                    "scenario": name,
                    "policy": "vtc",
                    "long_prompt": args.long_prompt,
                    "long_streams_per_tenant": args.long_streams,
                    "kv_tokens": kv_tokens,
                    "seconds": args.long_s,
                    "chat_alone": alone,
                    **runs,
                    "order": "plugin first" if args.plugin_first else "stock first",
                }
            )
        )


def save(results: list[dict[str, Any]], scenario: str, mode: str) -> None:
    with (OUT / f"{scenario}-{mode}.jsonl").open("w") as file:
        for row in results:
            file.write(json.dumps(row) + "\n")


def build_model(model_dir: Path, max_positions: int = 4096) -> None:
    if (model_dir / "config.json").exists():
        return
    builder = ROOT / "tests" / "integrations" / "vllm" / "tiny_model.py"
    command = [str(VLLM_PYTHON), str(builder), str(model_dir), "--layers", "4"]
    command += ["--vocab", str(VOCAB), "--max-positions", str(max_positions)]
    subprocess.run(command, check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=48, help="heavy requests outstanding")
    parser.add_argument("--flood-s", type=float, default=40.0, help="flood duration (s)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="trace time factor")
    parser.add_argument("--length-scale", type=float, default=0.15, help="trace length factor")
    parser.add_argument(
        "--sample", type=float, default=0.5, help="share of the trace's requests replayed"
    )
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--kv-tokens", type=int, default=8192)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument(
        "--scenarios",
        default="flood,arena",
        help="comma-separated, of flood, arena, long and mix",
    )
    parser.add_argument("--long-prompt", type=int, default=6144, help="long prompts' tokens")
    parser.add_argument("--long-streams", type=int, default=8, help="streams per long tenant")
    parser.add_argument("--long-s", type=float, default=60.0, help="long scenarios' duration")
    parser.add_argument(
        "--before-src",
        type=Path,
        help="a tree whose src/ holds the plugin to compare with (long and mix)",
    )
    parser.add_argument(
        "--plugin-first",
        action="store_true",
        help="run the plugin's server before stock's (flip the order between runs)",
    )
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"vLLM environment not found at {VLLM_PYTHON}: `make vllm-env` builds it")
    OUT.mkdir(parents=True, exist_ok=True)
    model_dir = OUT / "model"
    scenarios = {name.strip() for name in args.scenarios.split(",")}
    if not scenarios <= {"flood", "arena", "long", "mix"}:
        raise SystemExit(
            f"--scenarios: expected some of flood, arena, long and mix, got {args.scenarios!r}"
        )
    long_names = [name for name in ("long", "mix") if name in scenarios]
    if long_names:
        long_model = OUT / "model-8k"
        build_model(long_model, max_positions=8192)
        run_long_scenarios(long_model, args, long_names)
    if not scenarios & {"flood", "arena"}:
        return
    trace_path = args.shared / "traces" / "arena_vtc_600s.jsonl"
    trace = [json.loads(line) for line in trace_path.read_text().splitlines() if line.strip()]
    # A seeded thinning keeps every client's arrival pattern at a fraction of its rate.
    thinning = random.Random(3)
    trace = [row for row in trace if thinning.random() < args.sample]
    build_model(model_dir)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for mode in ("plugin", "stock") if args.plugin_first else ("stock", "plugin"):
        server = Server(model_dir, mode == "plugin", args, OUT / f"server-{mode}.log")
        try:
            server.wait_healthy()
            runs[mode] = {}
            if "flood" in scenarios:
                runs[mode]["flood"] = asyncio.run(flood(server.url, args))
            if "arena" in scenarios:
                runs[mode]["arena"] = asyncio.run(arena(server.url, trace, args))
        finally:
            server.stop()
        for scenario, results in runs[mode].items():
            save(results, scenario, mode)
    common = {"benchmark": "vllm_plugin", "policy": "vtc", "max_num_seqs": args.max_num_seqs}
    if "flood" in scenarios:
        print_flood(runs, args, common)
    if "arena" in scenarios:
        print_arena(runs, args, common, len(trace))


def print_flood(runs: dict[str, Any], args: argparse.Namespace, common: dict[str, Any]) -> None:
    stock, plugin = flood_figures(runs["stock"]["flood"]), flood_figures(runs["plugin"]["flood"])
    # Greedy outputs: each request's text, for the requests both modes sent (a
    # request's prompt is seeded by its id).
    texts = {mode: {r["request_id"]: r["text"] for r in runs[mode]["flood"]} for mode in runs}
    both = texts["stock"].keys() & texts["plugin"].keys()
    print(
        json.dumps(
            {
                **common,
                "scenario": "flood",
                "heavy_outstanding": args.flood,
                "seconds": args.flood_s,
                "stock": stock,
                "plugin": plugin,
                "light_ttft_p90_ratio": round(
                    plugin["light_ttft_p90_s"] / stock["light_ttft_p90_s"], 3
                ),
                "throughput_ratio": round(plugin["output_tok_s"] / stock["output_tok_s"], 3),
                "order": "plugin first" if args.plugin_first else "stock first",
                "greedy_identical": all(texts["stock"][r] == texts["plugin"][r] for r in both),
                "greedy_compared": len(both),
            }
        )
    )


def print_arena(
    runs: dict[str, Any], args: argparse.Namespace, common: dict[str, Any], requests: int
) -> None:
    stock_a = arena_figures(runs["stock"]["arena"], args)
    plugin_a = arena_figures(runs["plugin"]["arena"], args)
    print(
        json.dumps(
            {
                **common,
                "scenario": "arena",
                "time_scale": round(args.time_scale, 4),
                "length_scale": args.length_scale,
                "sample": args.sample,
                "requests": requests,
                "kv_tokens": args.kv_tokens,
                "stock": stock_a,
                "plugin": plugin_a,
                "max_diff_ratio": round(plugin_a["max_diff"] / stock_a["max_diff"], 3),
                "avg_diff_ratio": round(plugin_a["avg_diff"] / stock_a["avg_diff"], 3),
                "throughput_ratio": round(plugin_a["output_tok_s"] / stock_a["output_tok_s"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
