"""`tokenfair generate` and `tokenfair profile`: real models on this machine.

Both need the model extra (torch, transformers); without it they say so in one line.
The device is checked before any model is loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tokenfair.commands.common import (
    check_device,
    check_output_file,
    require_extra,
    user_errors,
)

MODEL_HELP = "builtin:tiny or a local transformers model directory."


def generate(
    prompt: Annotated[str, typer.Option(help="The prompt text.")],
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = "builtin:tiny",
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.", min=1)] = 64,
    temperature: Annotated[float, typer.Option(help="0 for greedy.", min=0.0)] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (>= 0).", min=0)] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu, cuda or cuda:N (default: cuda when available).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float32, bfloat16, float16 (default: the model's).")
    ] = None,
) -> None:
    """Generate a completion with a real model on this machine, printing tokens as they
    come (needs the [model] extra).

    builtin:tiny is a small randomly initialised Llama-shaped model: its text is
    meaningless; it exists to exercise the serving path without downloads.

    \b
    Example: tokenfair generate --model builtin:tiny --prompt "Hello" --max-tokens 32 --seed 1
    """
    require_extra("tokenfair generate", "model")
    check_device(device)
    from tokenfair.llm import generate_command

    with user_errors():
        for piece in generate_command(model, prompt, max_tokens, temperature, seed, device, dtype):
            sys.stdout.write(piece)
            sys.stdout.flush()
    sys.stdout.write("\n")


def profile(
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = "builtin:tiny",
    out: Annotated[Path | None, typer.Option(help="Write the fitted profile (JSON) here.")] = None,
    name: Annotated[
        str | None, typer.Option(help="Profile name (default: MODEL-measured).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N.")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16, float16.")] = None,
) -> None:
    """Measure engine step times over a grid of batch shapes and fit a simulator profile
    (needs the [model] extra).

    \b
    Example: tokenfair profile --model builtin:tiny --out tiny-cpu.json
    then: tokenfair simulate --trace t.jsonl --profile tiny-cpu.json --preset engine --kv-tokens 20000
    """
    check_output_file(out)
    require_extra("tokenfair profile", "model")
    check_device(device)
    from tokenfair.engine.hf.profile import measure_profile
    from tokenfair.engine.sim.profile import save_profile

    with user_errors():
        fitted = measure_profile(model, name=name, device=device, dtype=dtype)
        if out is not None:
            save_profile(fitted, out)
    print(json.dumps(fitted.to_json()))
