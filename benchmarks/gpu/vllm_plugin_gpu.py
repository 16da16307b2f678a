"""The vLLM plugin on a GPU: stock vLLM against FairAsyncScheduler, in one run.

For a machine with one NVIDIA GPU and vLLM 0.33 or 0.34 (GPU build) installed; tokenfair on
PYTHONPATH (`PYTHONPATH=src`) or installed. Nothing is downloaded: by default the model
is a random-weight Llama of about 1.1B parameters (TinyLlama's shape, bf16) that the
script builds on the GPU with a word-level tokenizer; `--model` serves a real one.

For each server in turn, stock vLLM and vLLM with
`--scheduler-cls tokenfair.integrations.vllm.FairAsyncScheduler` (VTC), both with
`--async-scheduling` and the same flags:

1. greedy check: `--greedy` requests (prompt 64, 48 tokens out, temperature 0) sent at
   once from one tenant, so both servers run the very same batches; their token ids
   must be identical;
2. flood: for `--flood-s` seconds a heavy tenant keeps `--flood` requests outstanding
   (prompt 512, 256 out, each one that ends replaced) while a light tenant sends one
   request at a time (prompt 64, 16 out). Light TTFT (send to first streamed token)
   p50/p90, and output tokens/s of the requests completed in the window.

Prints one JSON line: each server's figures and the plugin/stock ratios. Sized for
under 8 minutes on one GPU (two server starts, 2 x (flood + a few seconds));
`--cpu-smoke` runs the same code on vLLM's CPU build with a tiny model, to check the
script itself. Exits 2, saying why, without a GPU.

    PYTHONPATH=src python benchmarks/gpu/vllm_plugin_gpu.py [--model DIR] [--flood-s 45]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "m"
VOCAB = 32000
PLUGIN = "tokenfair.integrations.vllm.FairAsyncScheduler"


def build_random_llama(out: Path, *, cpu: bool) -> Path:
    """A random Llama (TinyLlama's shape on GPU; 2 small layers for --cpu-smoke)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = 1024 if cpu else VOCAB
    words = {"<s>": 0, "</s>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, vocab)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(out)
    shape = (
        dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
        if cpu
        else dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                  num_attention_heads=32, num_key_value_heads=4)
    )  # fmt: skip
    config = LlamaConfig(
        vocab_size=vocab,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="float32" if cpu else "bfloat16",
        **shape,
    )
    torch.manual_seed(0)
    device, dtype = ("cpu", torch.float32) if cpu else ("cuda", torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(out)
    del model
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    def __init__(self, model: str, plugin: bool, args: argparse.Namespace, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "2048", "--max-num-seqs", str(args.max_num_seqs),
            "--async-scheduling", "--no-enable-prefix-caching", "--seed", "0",
        ]  # fmt: skip
        if args.cpu_smoke:
            command += ["--dtype", "float32", "--enforce-eager"]
        else:
            command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
        if plugin:
            settings = {"tokenfair": {"policy": "vtc", "log_interval_s": 30}}
            command += ["--scheduler-cls", PLUGIN, "--additional-config", json.dumps(settings)]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
            ),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_HOST_IP="127.0.0.1",
        )
        if args.cpu_smoke:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; the default takes most of memory
        self.log = log
        self.process = subprocess.Popen(
            command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
        )

    def wait_healthy(self, timeout_s: float) -> float:
        import httpx

        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                errors = [
                    line
                    for line in self.log.read_text(errors="replace").splitlines()
                    if "Error" in line or "error" in line
                ]
                raise SystemExit(f"vLLM server exited ({self.log}):\n" + "\n".join(errors[-15:]))
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - started
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


def prompt_ids(length: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


async def complete(
    client: Any, url: str, prompt: list[int], max_tokens: int, tenant: str
) -> dict[str, Any]:
    """One streamed greedy completion: its first-token latency, token ids and count."""
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "vllm_xargs": {"tenant": tenant},
    }
    sent = time.monotonic()
    first: float | None = None
    tokens: list[int] = []
    completion_tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                ids = choice.get("token_ids") or []
                if (ids or choice.get("text")) and first is None:
                    first = time.monotonic() - sent
                tokens.extend(ids)
            if chunk.get("usage"):
                completion_tokens = chunk["usage"]["completion_tokens"]
    return {"ttft_s": first, "tokens": tokens, "completion_tokens": completion_tokens}


async def greedy_check(url: str, args: argparse.Namespace) -> list[list[int]]:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        results = await asyncio.gather(
            *(
                complete(client, url, prompt_ids(64, 10_000 + i, args.vocab), 48, "check")
                for i in range(args.greedy)
            )
        )
    return [r["tokens"] for r in results]


async def flood(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    deadline = time.monotonic() + args.flood_s
    heavy_tokens = light_tokens = 0
    light_ttft: list[float] = []
    counter = iter(range(1 << 30))

    async def heavy_worker(client: Any) -> None:
        nonlocal heavy_tokens
        while time.monotonic() < deadline:
            i = next(counter)
            result = await complete(client, url, prompt_ids(512, i, args.vocab), 256, "heavy")
            if time.monotonic() < deadline:
                heavy_tokens += result["completion_tokens"]

    async def light_worker(client: Any) -> None:
        nonlocal light_tokens
        j = 0
        while time.monotonic() < deadline:
            result = await complete(
                client, url, prompt_ids(64, 1_000_000 + j, args.vocab), 16, "light"
            )
            j += 1
            if time.monotonic() < deadline and result["ttft_s"] is not None:
                light_ttft.append(result["ttft_s"])
                light_tokens += result["completion_tokens"]

    limits = httpx.Limits(max_connections=args.flood + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        tasks = [asyncio.create_task(heavy_worker(client)) for _ in range(args.flood)]
        await asyncio.sleep(2)  # the flood is queued before the light tenant comes
        tasks.append(asyncio.create_task(light_worker(client)))
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        for task in tasks:
            task.cancel()  # requests still running are aborted (the client disconnects)
        await asyncio.gather(*tasks, return_exceptions=True)
    p90 = statistics.quantiles(light_ttft, n=10)[-1] if len(light_ttft) >= 2 else None
    return {
        "light_requests": len(light_ttft),
        "light_ttft_p50_s": round(statistics.median(light_ttft), 3) if light_ttft else None,
        "light_ttft_p90_s": round(p90, 3) if p90 is not None else None,
        "output_tok_s": round((heavy_tokens + light_tokens) / args.flood_s, 1),
    }


def measure(model: str, plugin: bool, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    name = "plugin" if plugin else "stock"
    server = Server(model, plugin, args, logs / f"{name}.log")
    try:
        startup = server.wait_healthy(args.startup_timeout_s)
        greedy = asyncio.run(greedy_check(server.url, args))
        figures = asyncio.run(flood(server.url, args))
    finally:
        server.stop()
    return {"startup_s": round(startup, 1), "greedy": greedy, **figures}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a local model directory (default: a random Llama)")
    parser.add_argument("--flood-s", type=float, default=45.0)
    parser.add_argument("--flood", type=int, default=128, help="heavy requests outstanding")
    parser.add_argument("--greedy", type=int, default=32, help="requests in the greedy check")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--startup-timeout-s", type=float, default=150.0)
    parser.add_argument("--cpu-smoke", action="store_true", help="vLLM's CPU build, tiny model")
    parser.add_argument("--logs", type=Path, help="keep the servers' logs here")
    args = parser.parse_args()
    started = time.monotonic()
    try:
        import torch
        import vllm
    except ImportError as error:
        print(f"vllm_plugin_gpu: needs vLLM (0.33 or 0.34, GPU build) and torch: {error}")
        sys.exit(2)
    if not args.cpu_smoke:
        if not torch.cuda.is_available():
            print("vllm_plugin_gpu: no CUDA device (use --cpu-smoke to check the script on CPU)")
            sys.exit(2)
        if not vllm.__version__.startswith(("0.33.", "0.34.")):
            print(f"vllm_plugin_gpu: made for vLLM 0.33 or 0.34, found {vllm.__version__}")
            sys.exit(2)
    else:
        args.flood, args.greedy, args.max_num_seqs = min(args.flood, 8), min(args.greedy, 4), 4
    args.vocab = 1024 if args.cpu_smoke else VOCAB
    with tempfile.TemporaryDirectory(prefix="vllm-plugin-gpu-") as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        model = args.model or str(build_random_llama(Path(tmp) / "model", cpu=args.cpu_smoke))
        if args.model:
            from transformers import AutoConfig

            args.vocab = AutoConfig.from_pretrained(args.model).vocab_size
        stock = measure(model, False, args, logs)
        plugin = measure(model, True, args, logs)
    # Every check request must have produced all its tokens, or the comparison says nothing.
    stock_greedy, plugin_greedy = stock.pop("greedy"), plugin.pop("greedy")
    complete_outputs = all(len(tokens) == 48 for tokens in stock_greedy + plugin_greedy)
    identical = complete_outputs and stock_greedy == plugin_greedy
    print(
        json.dumps(
            {
                "benchmark": "vllm_plugin_gpu",
                "vllm": vllm.__version__,
                "device": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(0),
                "model": args.model
                or ("random llama, 2 small layers" if args.cpu_smoke else "random llama 1.1B bf16"),
                "scheduler": PLUGIN,
                "flood_s": args.flood_s,
                "heavy_outstanding": args.flood,
                "stock": stock,
                "plugin": plugin,
                "light_ttft_p90_ratio": ratio(
                    plugin["light_ttft_p90_s"], stock["light_ttft_p90_s"]
                ),
                "output_tok_s_ratio": ratio(plugin["output_tok_s"], stock["output_tok_s"]),
                "greedy_requests": len(stock_greedy),
                "greedy_identical": identical,
                "wall_s": round(time.monotonic() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
