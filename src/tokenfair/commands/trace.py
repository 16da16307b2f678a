"""`tokenfair trace`: make trace files from the paper's suites or from public traces."""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenfair.commands.common import check_output_file, fail, user_errors
from tokenfair.workloads.trace import TraceRecord

trace_app = typer.Typer(
    help="Generate or convert trace files (JSONL, one request a line).", no_args_is_help=True
)


class TraceFormat(StrEnum):
    burstgpt = "burstgpt"
    azure = "azure"
    mooncake = "mooncake"
    sharegpt = "sharegpt"


def _summary(records: Sequence[TraceRecord], out: Path) -> str:
    clients = {r.client for r in records}
    span = records[-1].arrival_s - records[0].arrival_s if records else 0.0
    return json.dumps(
        {
            "out": str(out),
            "requests": len(records),
            "clients": len(clients),
            "span_s": round(span, 3),
        }
    )


@trace_app.command("gen")
def generate(
    suite: Annotated[str | None, typer.Argument(help="Suite name (see --list).")] = None,
    out: Annotated[Path | None, typer.Option(help="Trace file to write.")] = None,
    seed: Annotated[
        int, typer.Option(help="Random seed (arrival phases, Poisson draws), >= 0.", min=0)
    ] = 0,
    weights_out: Annotated[
        Path | None,
        typer.Option(help="Also write the suite's client weights (JSON; weighted suites only)."),
    ] = None,
    list_suites: Annotated[bool, typer.Option("--list", help="List the suites and exit.")] = False,
) -> None:
    """Write one of the paper's workload suites (SPEC section 7) as a trace file.

    \b
    Example: tokenfair trace gen overload --out overload.jsonl --seed 1
    """
    from tokenfair.workloads.suites import SUITES, generate_suite, suite_descriptions
    from tokenfair.workloads.trace import write_trace

    if list_suites or suite is None:
        table = Table("suite", "what it is")
        for name, text in suite_descriptions().items():
            table.add_row(name, text)
        Console().print(table)
        if suite is None and not list_suites:
            fail("name a suite to generate, e.g. `tokenfair trace gen overload --out t.jsonl`")
        return
    if out is None:
        fail("--out FILE is required")
    if suite not in SUITES:
        fail(f"unknown suite {suite!r}; known suites: {', '.join(SUITES)}")
    check_output_file(out)
    check_output_file(weights_out, "--weights-out")
    # Checked before any work: a failed command leaves no half of its output behind.
    weighted = [n for n, d in SUITES.items() if any(c.weight != 1.0 for c in d.clients)]
    if weights_out is not None and suite not in weighted:
        fail(
            f"--weights-out: suite {suite!r} has no client weights "
            f"(weighted suites: {', '.join(weighted)})"
        )
    with user_errors():
        generated = generate_suite(suite, seed=seed)
        write_trace(generated.records, out)
        if weights_out is not None:
            weights_out.write_text(json.dumps(generated.weights, indent=2) + "\n")
    print(_summary(generated.records, out))


@trace_app.command("convert")
def convert(
    fmt: Annotated[
        TraceFormat,
        typer.Argument(metavar="FORMAT", help="burstgpt | azure | mooncake | sharegpt."),
    ],
    source: Annotated[Path, typer.Argument(help="The public trace file to read.")],
    out: Annotated[Path, typer.Option(help="Trace file to write.")],
    client: Annotated[
        str,
        typer.Option(help="Who the client is: column:NAME, hash:NAME:N (N clients) or const:NAME."),
    ] = "const:default",
    speedup: Annotated[float, typer.Option(help="Divide arrival times by this.")] = 1.0,
    duration: Annotated[
        float | None, typer.Option(help="Keep arrivals before this many seconds.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Keep the first N requests.", min=1)] = None,
    skip_invalid: Annotated[
        bool, typer.Option(help="Drop rows that cannot be requests (counted) instead of failing.")
    ] = False,
    rate: Annotated[
        float, typer.Option(help="sharegpt only: conversations starting per second (Poisson).")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="sharegpt only: arrival seed, >= 0.", min=0)] = 0,
    multiturn: Annotated[
        bool,
        typer.Option(
            help="sharegpt only: one request per exchange, each prompt the whole "
            "conversation so far (prefix fields filled), instead of the first exchange."
        ),
    ] = False,
    turn_gap: Annotated[
        float,
        typer.Option(help="sharegpt --multiturn: mean seconds between a conversation's turns."),
    ] = 30.0,
) -> None:
    """Convert a public trace (BurstGPT, Azure, Mooncake, ShareGPT) into tokenfair's JSONL.

    \b
    Example: tokenfair trace convert burstgpt BurstGPT_1.csv --out burst.jsonl --client column:Model --skip-invalid
    """
    from tokenfair.workloads import convert as converters
    from tokenfair.workloads.arrivals import Poisson
    from tokenfair.workloads.client_map import parse_client_map
    from tokenfair.workloads.trace import write_trace

    check_output_file(out)
    if source.is_dir():
        fail(f"{source} is a folder: give the trace file to convert")
    with user_errors():
        clients = parse_client_map(client)
        if fmt is TraceFormat.sharegpt:
            records = converters.convert_sharegpt(
                source,
                clients,
                arrivals=Poisson(rate),
                seed=seed,
                speedup=speedup,
                duration_s=duration,
                limit=limit,
                skip_invalid=skip_invalid,
                multiturn=multiturn,
                turn_gap_s=turn_gap,
            )
        else:
            if multiturn:
                fail(
                    "--multiturn is for sharegpt conversations (mooncake fills the prefix fields by itself)"
                )
            convert_fn = getattr(converters, f"convert_{fmt.value}")
            records = convert_fn(
                source,
                clients,
                speedup=speedup,
                duration_s=duration,
                limit=limit,
                skip_invalid=skip_invalid,
            )
    if not records:
        fail(f"{source}: no request to convert (check --duration and --limit); nothing written")
    with user_errors():
        write_trace(records, out)
    print(_summary(records, out))
