"""tokenfair serve vs vLLM's OpenAI server (CPU build), same model directory, same load.

The model: a random-weight Llama (hidden 256, 4 layers, vocab 1024, 3.7M parameters)
with a word-level tokenizer, saved under out/bench-server/model (built once). Both
servers: float32, 16 sequences at most, prefix caching off; vLLM eager. Each server runs
alone (the other is stopped), the load generator in its own process.

1. throughput: 64 concurrent streams, 128-token prompts, 128 output tokens (EOS
   ignored), 96 requests: output tokens/s and TTFT p50/p90.
2. flood: tenant A keeps 64 streams open (16-112 output tokens each, seeded, back to
   back) while
   tenant B sends 10 requests one at a time (8 tokens; those not done within 900 s are
   dropped): B's TTFT p50/p90. tokenfair
   runs VTC with A and B as tenants (API keys); vLLM has no tenants (FCFS).

Also tokenfair's engine offline (tokenfair.LLM) on the throughput workload, alternated
with the same workload through the server, its engine in its own process (the default
for real models) and on a thread of the server process (`--engine thread`) (--rounds,
order flipped each round, median ratios; --rounds 0 skips it): what the server costs. Prints one JSON line per server and scenario. Without vLLM it says so and measures
tokenfair alone.

    nice -n 10 .venv/bin/python benchmarks/server_vs_vllm.py [--vllm-python .venv-vllm/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from server_tools.common import (
    OUT,
    ROOT,
    Process,
    emit,
    free_port,
    loadgen,
    run_load,
    tokenfair_server,
)

SEATS = 16
OFFLINE = ROOT / "benchmarks" / "server_tools" / "offline.py"
NAME = "tiny"
PROMPT = " ".join(f"t{5 + i % 1000}" for i in range(128))
LIGHT_PROMPT = " ".join(f"t{7 + i}" for i in range(16))


def build_model_dir(path: Path) -> Path:
    if (path / "config.json").exists():
        return path
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab_size = 1024
    vocab = {f"t{i}": i for i in range(3, vocab_size)} | {"<unk>": 0, "<s>": 1, "</s>": 2}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    config = LlamaConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=688, vocab_size=vocab_size, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def vllm_server(python: str, model_dir: Path, timeout: float = 600) -> Process:
    port = free_port()
    cache = OUT / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_CACHE_ROOT": str(cache),
        "HF_HOME": str(cache), "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    }  # fmt: skip
    env.pop("PYTHONPATH", None)
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--dtype", "float32", "--enforce-eager",
        "--max-num-seqs", str(SEATS),
    ]  # fmt: skip
    server = Process(command, env, OUT / f"vllm-{port}.log", f"http://127.0.0.1:{port}")
    server.wait_healthy(timeout)
    return server


def scenarios(server_name: str, url: str) -> None:
    run_load(
        url, NAME, "--concurrency", "4", "--requests", "8", "--max-tokens", "8", "--prompt", PROMPT
    )  # warm up
    result = run_load(
        url, NAME, "--concurrency", "64", "--requests", "96", "--max-tokens", "128",
        "--prompt", PROMPT, "--stream", "--ignore-eos", "--key", "heavy-key",
    )  # fmt: skip
    emit({"benchmark": "server_vs_vllm", "server": server_name, "scenario": "throughput", **result})
    heavy = loadgen(
        url, NAME, "--concurrency", "64", "--requests", "1000000", "--max-tokens", "112", "--max-tokens-min", "16",
        "--prompt", PROMPT, "--stream", "--ignore-eos", "--key", "heavy-key",
    )  # fmt: skip
    try:
        time.sleep(8)  # A fills every seat and builds its backlog
        light = run_load(
            url, NAME, "--concurrency", "1", "--requests", "10", "--duration", "900", "--max-tokens", "8",
            "--prompt", LIGHT_PROMPT, "--stream", "--ignore-eos", "--key", "light-key",
        )  # fmt: skip
        emit(
            {
                "benchmark": "server_vs_vllm",
                "server": server_name,
                "scenario": "flood_light_tenant",
                **light,
            }
        )
    finally:
        heavy.send_signal(signal.SIGTERM)
        heavy.wait()


def offline_throughput(model_dir: Path, *flags: str) -> dict[str, object]:
    offline = subprocess.run(
        ["nice", "-n", "10", sys.executable, str(OFFLINE), str(model_dir), *flags],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        check=True,
    )
    return dict(json.loads(offline.stdout.decode().strip().splitlines()[-1]))


def server_cost(url: str, thread_url: str, model_dir: Path, rounds: int) -> None:
    """The engine offline, and through the server with its engine in its own process
    (the default) and on a thread of the server process (`--engine thread`, both servers
    idle meanwhile), alternated, `rounds` times, order reversed each round: what the
    server costs, as median ratios."""
    for each in (url, thread_url):
        run_load(
            each, NAME, "--concurrency", "4", "--requests", "8", "--max-tokens", "8",
            "--prompt", PROMPT,
        )  # fmt: skip  # warm up
    ratios: dict[str, list[float]] = {"served": [], "served_thread": []}
    kinds = ("offline", "served", "served_thread")
    for round_ in range(rounds):
        runs = {}
        for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
            if kind == "offline":
                runs[kind] = offline_throughput(model_dir)
            else:
                runs[kind] = run_load(
                    url if kind == "served" else thread_url, NAME, "--concurrency", "64",
                    "--requests", "96", "--max-tokens", "128", "--prompt", PROMPT, "--stream",
                    "--ignore-eos", "--key", "heavy-key",
                )  # fmt: skip
        rate = {kind: float(runs[kind]["output_tokens_per_s"]) for kind in kinds}  # type: ignore[arg-type]
        for kind, values in ratios.items():
            values.append(rate[kind] / rate["offline"])
        emit(
            {
                "benchmark": "server_vs_vllm",
                "scenario": "server_cost",
                "round": round_,
                **{f"{kind}_tokens_per_s": rate[kind] for kind in kinds},
                **{f"{kind}_over_offline": round(v[-1], 3) for kind, v in ratios.items()},
            }
        )
    emit(
        {
            "benchmark": "server_vs_vllm",
            "scenario": "server_cost",
            "rounds": rounds,
            **{
                f"{kind}_over_offline_median": round(statistics.median(v), 3)
                for kind, v in ratios.items()
            },
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--skip", choices=["tokenfair", "vllm"], default=None)
    parser.add_argument(
        "--rounds", type=int, default=3, help="offline vs served throughput, alternated"
    )
    args = parser.parse_args()
    # SIGTERM (e.g. from `timeout`) runs the finally blocks that stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    model_dir = build_model_dir(OUT / "model")
    tenants = OUT / "flood-tenants.yaml"
    from tokenfair.edge.tenants import hash_key

    tenants.write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"name": "heavy", "key_sha256": [hash_key("heavy-key")], "max_waiting": 4096},
                    {"name": "light", "key_sha256": [hash_key("light-key")], "max_waiting": 4096},
                ]
            }
        )
    )
    if args.skip != "tokenfair":
        tokenfair_args = (
            "--model", str(model_dir), "--served-model-name", NAME, "--policy", "vtc",
            "--tenants", str(tenants), "--device", "cpu", "--dtype", "float32",
            "--kv-tokens", "65536", "--max-num-seqs", str(SEATS),
        )  # fmt: skip
        server = tokenfair_server(*tokenfair_args)
        try:
            if args.rounds:
                thread_server = tokenfair_server(*tokenfair_args, "--engine", "thread")
                try:
                    server_cost(server.url, thread_server.url, model_dir, args.rounds)
                finally:
                    thread_server.stop()
            scenarios("tokenfair", server.url)
        finally:
            server.stop()
    if args.skip != "vllm":
        if not Path(args.vllm_python).exists():
            emit(
                {
                    "benchmark": "server_vs_vllm",
                    "server": "vllm",
                    "skipped": f"no {args.vllm_python}",
                }
            )
            return
        server = vllm_server(args.vllm_python, model_dir)
        try:
            scenarios("vllm", server.url)
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
