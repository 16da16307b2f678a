"""`tokenfair metrics`: the fairness metrics of a results file (SPEC section 6).

T (the measured duration) comes from the data, the last arrival rounded down to whole
seconds as the paper's artifact does, unless --duration is given; the value used is
printed on stderr, so a number is never read without the interval it covers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tokenfair.commands.common import (
    check_weights,
    note,
    read_results_file,
    read_weights_file,
    user_errors,
    warn,
)


def metrics(
    results: Annotated[
        Path, typer.Argument(help="Per-request results (JSONL) from simulate or a server.")
    ],
    duration: Annotated[
        float | None,
        typer.Option(help="T in seconds (default: the last arrival, rounded down).", min=0.0),
    ] = None,
    window: Annotated[float, typer.Option(help="w: the rate window in seconds.")] = 60.0,
    warmup: Annotated[float, typer.Option(help="Seconds skipped at the start.", min=0.0)] = 30.0,
    weights: Annotated[
        Path | None, typer.Option(help="JSON {client: weight, 0.01 to 100}.")
    ] = None,
    full: Annotated[bool, typer.Option(help="Print every per-tick series too.")] = False,
) -> None:
    """Print the fairness metrics of SPEC section 6 (Max/Avg/Var Diff, throughput,
    per-client TTFT...) as JSON.

    \b
    Example: tokenfair metrics vtc.jsonl --window 60 --warmup 30
    """
    from tokenfair.fairness.report import fairness_report

    records = read_results_file(results)
    client_weights = read_weights_file(weights)
    check_weights(client_weights, {r.client for r in records})
    with user_errors():
        report = fairness_report(
            records,
            duration_s=duration,
            window_s=window,
            warmup_s=warmup,
            weights=client_weights,
        )
    source = (
        "the last arrival, rounded down; --duration to choose" if duration is None else "--duration"
    )
    note(f"T = {report.params.duration_s:g} s ({source}), w = {window:g} s, warm-up {warmup:g} s")
    if report.num_rejected:
        warn(
            f"{report.num_rejected:,} of {report.num_requests:,} requests were rejected: they add no service"
        )
    print(json.dumps(report.to_json(full), indent=2))
