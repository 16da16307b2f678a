"""`tokenfair trace`: make trace files from the workload suites or from public traces."""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tokenfair.commands.common import check_output_file, fail, user_errors
from tokenfair.workloads.trace import TraceRecord

if TYPE_CHECKING:
    from tokenfair.workloads.documents import DocumentsSpec
    from tokenfair.workloads.lengths import LengthDist

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


DOCS_PANEL = "documents workload (tokenfair trace gen documents)"
MIX_PANEL = "random mix of tenants (tokenfair trace gen mix)"
MIX = "mix"


def _doc_option(help_text: str) -> typer.models.OptionInfo:
    return typer.Option(help=help_text, rich_help_panel=DOCS_PANEL)


# DocumentsSpec's parameters -> the options that set them.
DOCUMENT_OPTIONS = {
    "clients": "--clients",
    "documents_per_client": "--documents-per-client",
    "document_tokens": "--document-tokens",
    "skew": "--skew",
    "busy_factor": "--busy-factor",
    "rate": "--rate",
    "question": "--question-tokens",
    "answer": "--output-tokens",
    "shared_documents": "--shared-documents",
    "duration_s": "--duration",
}


def parse_length_range(option: str, text: str) -> LengthDist:
    """`N` (always N tokens) or `LOW-HIGH` (uniform, inclusive); a bad value names the option."""
    from tokenfair.workloads.lengths import Fixed, UniformInt

    low, dash, high = text.strip().partition("-")
    try:
        if not dash:
            return Fixed(int(low))
        return UniformInt(int(low), int(high))
    except ValueError:
        pass
    fail(f"{option}: expected N or LOW-HIGH tokens (e.g. 50-150, LOW <= HIGH, >= 1), got {text!r}")


def documents_spec(options: dict[str, Any]) -> DocumentsSpec:
    """The `documents` workload from the options given (None: the default)."""
    from tokenfair.workloads.documents import DocumentsOptionError, DocumentsSpec

    values = {name: value for name, value in options.items() if value is not None}
    for name in ("question", "answer"):
        if name in values:
            values[name] = parse_length_range(DOCUMENT_OPTIONS[name], values[name])
    try:
        return DocumentsSpec(**values)
    except DocumentsOptionError as error:
        problem = error.problem
        for field, option in DOCUMENT_OPTIONS.items():
            problem = problem.replace(field, option)
        fail(f"{DOCUMENT_OPTIONS[error.option]} {problem}")


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
    clients: Annotated[int | None, _doc_option("Clients (default 6).")] = None,
    documents_per_client: Annotated[
        int | None, _doc_option("Documents each client asks about (default 4).")
    ] = None,
    document_tokens: Annotated[
        int | None, _doc_option("Tokens of each document (default 2500).")
    ] = None,
    skew: Annotated[
        float | None,
        _doc_option(
            "Popularity skew across a client's documents: document k is asked with "
            "probability ~ 1/(k+1)^skew (Zipf exponent; default 0, uniform)."
        ),
    ] = None,
    busy_factor: Annotated[
        float | None, _doc_option("client-0's request rate as a multiple of the others' (2.5).")
    ] = None,
    rate: Annotated[
        float | None,
        _doc_option(
            "Requests/s of each other client, Poisson (default 0.5: backlogged on the A10G)."
        ),
    ] = None,
    question_tokens: Annotated[
        str | None, _doc_option("Question after the document: N or LOW-HIGH (default 50-150).")
    ] = None,
    output_tokens: Annotated[
        str | None, _doc_option("Answer length: N or LOW-HIGH (default 100-300).")
    ] = None,
    shared_documents: Annotated[
        int | None,
        _doc_option(
            "How many of each client's documents are the same for every client (one "
            "prefix group across clients; the most popular ones; default 0)."
        ),
    ] = None,
    duration: Annotated[float | None, _doc_option("Seconds of arrivals (default 300).")] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="The GPU the mix is drawn for: a10g (A10G Llama-2-7B, 24,000-token pool; "
            "heavy prompts of 1.5k-6k tokens) or h200 (H200 Llama-3-8B, 900,000-token "
            "pool; heavy prompts of 16k-100k tokens). Default a10g.",
            rich_help_panel=MIX_PANEL,
        ),
    ] = None,
) -> None:
    """Write one of the workload suites (the paper's, SPEC section 7, and others) as a trace file.

    `documents` (retrieval: clients asking about long documents of their own, the
    documents cached as prefixes) takes the options of its panel below.

    `mix` is a random mix of tenants, drawn from --seed for --profile: 1-3 heavy
    tenants (`heavy-0`...) flooding long prompts (a few hundred output tokens each)
    at 1.5-3x what the GPU serves, beside 2-5 light chat tenants (`light-0`...: prompts
    of 50-600 tokens, outputs of 50-300, Poisson at 0.2-0.8 requests/s, 0.35x that on
    the A10G), weights 1-4 in half of the mixes, 100-120 s of arrivals. It prints the
    mix's tenants; --weights-out writes every tenant's weight (1 in unweighted mixes).
    benchmarks/any_mix.py runs many of them.

    \b
    Example: tokenfair trace gen overload --out overload.jsonl --seed 1
    Example: tokenfair trace gen documents --skew 1 --shared-documents 1 --out docs.jsonl
    Example: tokenfair trace gen mix --seed 7 --profile h200 --out mix.jsonl --weights-out w.json
    """
    from tokenfair.workloads.suites import SUITES, documents_workload, generate_suite
    from tokenfair.workloads.trace import write_trace

    if list_suites or suite is None:
        _list_suites()
        if suite is None and not list_suites:
            fail("name a suite to generate, e.g. `tokenfair trace gen overload --out t.jsonl`")
        return
    if out is None:
        fail("--out FILE is required")
    if suite not in SUITES and suite != MIX:
        fail(f"unknown suite {suite!r}; known suites: {', '.join([*SUITES, MIX])}")
    if profile is not None and suite != MIX:
        fail(f"--profile is an option of the mix workload, not of suite {suite!r}")
    options = {
        "clients": clients,
        "documents_per_client": documents_per_client,
        "document_tokens": document_tokens,
        "skew": skew,
        "busy_factor": busy_factor,
        "rate": rate,
        "question": question_tokens,
        "answer": output_tokens,
        "shared_documents": shared_documents,
        "duration_s": duration,
    }
    given = [DOCUMENT_OPTIONS[name] for name, value in options.items() if value is not None]
    if given and suite != "documents":
        fail(f"{given[0]} is an option of the documents workload, not of suite {suite!r}")
    spec = documents_spec(options) if suite == "documents" else None
    check_output_file(out)
    check_output_file(weights_out, "--weights-out")
    if suite == MIX:
        _write_mix(seed, profile or "a10g", out, weights_out)
        return
    # Checked before any work: a failed command leaves no half of its output behind.
    weighted = [n for n, d in SUITES.items() if any(c.weight != 1.0 for c in d.clients)]
    if weights_out is not None and suite not in weighted:
        fail(
            f"--weights-out: suite {suite!r} has no client weights "
            f"(weighted suites: {', '.join(weighted)})"
        )
    with user_errors():
        if spec is not None:
            generated = documents_workload(spec, seed=seed)
        else:
            generated = generate_suite(suite, seed=seed)
        write_trace(generated.records, out)
        if weights_out is not None:
            weights_out.write_text(json.dumps(generated.weights, indent=2) + "\n")
    print(_summary(generated.records, out))


def _write_mix(seed: int, profile: str, out: Path, weights_out: Path | None) -> None:
    """`trace gen mix`: the mix's trace (and weights); prints its summary and tenants."""
    from tokenfair.workloads.mixes import PROFILES, random_mix
    from tokenfair.workloads.trace import write_trace

    if profile not in PROFILES:
        fail(f"--profile {profile!r}: expected one of {', '.join(PROFILES)}")
    with user_errors():
        mix = random_mix(seed, profile)
        write_trace(mix.records, out)
        if weights_out is not None:
            weights_out.write_text(json.dumps(mix.spec.weights, indent=2) + "\n")
    summary = json.loads(_summary(mix.records, out))
    print(json.dumps({**summary, "mix": mix.spec.to_json()}))


def _list_suites() -> None:
    from tokenfair.workloads.mixes import describe_mixes
    from tokenfair.workloads.suites import suite_descriptions

    table = Table("suite", "what it is")
    for name, text in suite_descriptions().items():
        table.add_row(name, text)
    table.add_row(MIX, describe_mixes())
    Console().print(table)


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
