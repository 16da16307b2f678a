"""The `tokenfair` command."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenfair.commands.experiment import experiment_app
from tokenfair.commands.gateway import gateway as gateway_command
from tokenfair.commands.tenants import tenants_app
from tokenfair.commands.trace import trace_app
from tokenfair.core.policies import POLICY_HELP, make_policy
from tokenfair.core.scheduler import ConfigError, SchedulerConfig

app = typer.Typer(
    help="tokenfair: fair-share scheduling for multi-tenant LLM inference (Virtual Token Counter).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
app.add_typer(trace_app, name="trace")
app.add_typer(experiment_app, name="experiment")
app.command("gateway")(gateway_command)
app.add_typer(tenants_app, name="tenants")

DEFAULT_SHARED = Path("../shared")


def fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code=2)


def read_weights(path: Path | None) -> dict[str, float] | None:
    """A JSON object {client: weight > 0}, or None without a file."""
    from tokenfair.workloads.weights import WeightsError
    from tokenfair.workloads.weights import read_weights as read_weights_file

    if path is None:
        return None
    try:
        return read_weights_file(path)
    except WeightsError as error:
        raise fail(str(error)) from None


def build_config(
    preset: str,
    kv_tokens: int | None,
    admission: str | None,
    preemption: str | None,
    **overrides: object,
) -> SchedulerConfig:
    settings = {k: v for k, v in overrides.items() if v is not None}
    if kv_tokens is not None:
        settings["kv_tokens"] = kv_tokens
    if admission is not None:
        settings["admission"] = admission
    if preemption is not None:
        settings["preemption"] = preemption
    try:
        if preset == "paper":
            return SchedulerConfig.paper(**settings)
        if preset == "engine":
            return SchedulerConfig.from_dict(settings)
    except (ConfigError, TypeError) as error:
        raise fail(str(error)) from None
    raise fail(f"unknown preset {preset!r}: expected 'paper' or 'engine'")


@app.command()
def simulate(
    trace: Annotated[Path, typer.Option(help="Trace file (JSONL, one request a line).")],
    policy: Annotated[str, typer.Option(help="Scheduling policy, e.g. fcfs, vtc, rpm:20.")] = "vtc",
    profile: Annotated[
        str, typer.Option(help="Step-time profile name or JSON file.")
    ] = "a10g-llama-7b",
    preset: Annotated[
        str,
        typer.Option(
            help="'paper': the paper's router (reserve, separate prefill); 'engine': vLLM-like."
        ),
    ] = "paper",
    kv_tokens: Annotated[int | None, typer.Option(help="KV pool size in tokens.")] = None,
    admission: Annotated[str | None, typer.Option(help="reserve | optimistic.")] = None,
    preemption: Annotated[str | None, typer.Option(help="recompute | swap.")] = None,
    swap_tokens: Annotated[int | None, typer.Option(help="CPU swap area in tokens.")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Most requests running at once.")] = None,
    max_batched_tokens: Annotated[int | None, typer.Option(help="Most tokens per step.")] = None,
    weights: Annotated[Path | None, typer.Option(help="JSON {client: weight} for wvtc.")] = None,
    cost: Annotated[
        str, typer.Option(help="Counter cost: linear (w_in=1, w_out=2) or profiled.")
    ] = "linear",
    out: Annotated[
        Path | None, typer.Option(help="Write per-request results (JSONL) here.")
    ] = None,
) -> None:
    """Replay a trace through the real scheduler on a virtual clock.

    Example: tokenfair simulate --trace ../shared/traces/arena_vtc_600s.jsonl --policy vtc --out vtc.jsonl
    """
    from tokenfair.core.cost import make_cost
    from tokenfair.engine.sim.profile import load_profile
    from tokenfair.engine.sim.simulator import simulate as run_simulation
    from tokenfair.results import write_results
    from tokenfair.workloads.trace import read_trace

    try:
        records = read_trace(trace)
        step_profile = load_profile(profile)
        chosen = make_policy(policy, weights=read_weights(weights), cost=make_cost(cost))
    except (OSError, ValueError) as error:
        raise fail(str(error)) from None
    config = build_config(
        preset,
        kv_tokens,
        admission,
        preemption,
        swap_tokens=swap_tokens,
        max_num_seqs=max_num_seqs,
        max_batched_tokens=max_batched_tokens,
    )
    started = time.perf_counter()
    result = run_simulation(records, chosen, step_profile, config)
    wall = time.perf_counter() - started
    if out is not None:
        write_results(result.results, out)
    served = [r for r in result.results if r.finish_s is not None and r.first_token_s is not None]
    tokens = sum(r.input_tokens + r.output_tokens for r in served)
    summary = {
        "policy": chosen.name,
        "requests": len(result.results),
        "served": len(served),
        "makespan_s": round(result.makespan_s, 3),
        "throughput_tok_s": round(tokens / result.makespan_s, 2) if result.makespan_s else 0.0,
        "steps": result.steps,
        "preemptions": result.preemptions,
        "swaps": result.swaps,
        "preemptions_by_client": result.preemptions_by_client,
        "policy_preemptions": result.policy_preemptions,
        "wall_s": round(wall, 3),
        "out": str(out) if out else None,
    }
    if result.memory_preemptions > 0.1 * len(result.results):
        by_client = result.memory_preemptions_by_client
        worst = max(by_client, key=by_client.__getitem__)
        console.print(
            f"[yellow]warning:[/yellow] {result.memory_preemptions} preemptions under memory pressure "
            f"for {len(result.results)} requests (most for {worst}): a sizing problem; give the "
            "KV pool more tokens or lower --max-num-seqs"
        )
    print(json.dumps(summary))


@app.command()
def metrics(
    results: Annotated[
        Path, typer.Argument(help="Per-request results (JSONL) from simulate or a server.")
    ],
    duration: Annotated[float, typer.Option(help="T: the trace's length in seconds.")] = 600.0,
    window: Annotated[float, typer.Option(help="w: the rate window in seconds.")] = 60.0,
    warmup: Annotated[float, typer.Option(help="Seconds skipped at the start.")] = 30.0,
    weights: Annotated[Path | None, typer.Option(help="JSON {client: weight}.")] = None,
    full: Annotated[bool, typer.Option(help="Print every per-tick series too.")] = False,
) -> None:
    """Print the fairness metrics of SPEC section 6 (Max/Avg/Var Diff, throughput, per-client TTFT...) as JSON.

    Example: tokenfair metrics vtc.jsonl --duration 600 --window 60 --warmup 30
    """
    from tokenfair.fairness.report import fairness_report
    from tokenfair.results import read_results

    try:
        records = read_results(results)
        report = fairness_report(
            records,
            duration_s=duration,
            window_s=window,
            warmup_s=warmup,
            weights=read_weights(weights),
        )
    except (OSError, ValueError) as error:
        raise fail(str(error)) from None
    print(json.dumps(report.to_json(full), indent=2))


@app.command()
def generate(
    prompt: Annotated[str, typer.Option(help="The prompt text.")],
    model: Annotated[
        str, typer.Option(help="builtin:tiny or a local transformers model directory.")
    ] = "builtin:tiny",
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 for greedy.")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda (default: cuda when available).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float32, bfloat16, float16 (default: the model's).")
    ] = None,
) -> None:
    """Generate a completion with a real model on this machine (needs the [model] extra).

    builtin:tiny is a small randomly initialised Llama-shaped model: its text is
    meaningless; it exists to exercise the serving path without downloads.

    Example: tokenfair generate --model builtin:tiny --prompt "Hello" --max-tokens 32 --seed 1
    """
    try:
        from tokenfair.llm import generate_command
    except ImportError as error:
        raise fail(
            f"real models need the model extra (pip install -e '.[model]'): {error}"
        ) from None
    try:
        text = generate_command(model, prompt, max_tokens, temperature, seed, device, dtype)
    except (OSError, ValueError) as error:
        raise fail(str(error)) from None
    print(text)


@app.command("profile")
def profile_command(
    model: Annotated[
        str, typer.Option(help="builtin:tiny or a local transformers model directory.")
    ] = "builtin:tiny",
    out: Annotated[Path | None, typer.Option(help="Write the fitted profile (JSON) here.")] = None,
    name: Annotated[
        str | None, typer.Option(help="Profile name (default: MODEL-measured).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda.")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16, float16.")] = None,
) -> None:
    """Measure engine step times over a grid of batch shapes and fit a simulator profile.

    Example: tokenfair profile --model builtin:tiny --out tiny-cpu.json
    then: tokenfair simulate --trace t.jsonl --profile tiny-cpu.json --preset engine
    """
    try:
        from tokenfair.engine.hf.profile import measure_profile
        from tokenfair.engine.sim.profile import save_profile
    except ImportError as error:
        raise fail(
            f"real models need the model extra (pip install -e '.[model]'): {error}"
        ) from None
    try:
        fitted = measure_profile(model, name=name, device=device, dtype=dtype)
    except (OSError, ValueError) as error:
        raise fail(str(error)) from None
    if out is not None:
        save_profile(fitted, out)
    print(json.dumps(fitted.to_json()))


@app.command()
def policies() -> None:
    """List the scheduling policies by name.

    Example: tokenfair policies
    """
    table = Table("policy", "what it does")
    for name, text in POLICY_HELP.items():
        table.add_row(name, text)
    Console().print(table)


@app.command()
def profiles() -> None:
    """List the shipped simulator step-time profiles.

    Example: tokenfair profiles
    """
    from tokenfair.engine.sim.profile import builtin_profiles, load_profile

    table = Table("profile", "description")
    for name in builtin_profiles():
        table.add_row(name, getattr(load_profile(name), "description", ""))
    Console().print(table)


@app.command()
def demo(
    shared: Annotated[
        Path, typer.Option(help="The shared/ folder holding traces/.")
    ] = DEFAULT_SHARED,
    out: Annotated[Path, typer.Option(help="Where the report and figures go.")] = Path("out/demo"),
) -> None:
    """Run the paper experiment (quick): the arena trace under every policy, each paper
    suite under FCFS and VTC (weighted VTC on the weighted suite) and the ablation, then
    print the arena table and where the report (markdown, HTML, PNG) is.

    Example: tokenfair demo --shared ../shared --out out/demo
    """
    from tokenfair.commands.experiment import run_demo

    run_demo(shared, out)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
