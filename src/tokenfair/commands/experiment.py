"""`tokenfair experiment`: the paper's experiments and policy comparisons on any trace.

Registered in the main CLI with `app.add_typer(experiment_app, name="experiment")`.
`run_demo` is what `make demo` runs: the quick paper experiment, its table, the report.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenfair.bundled import data_dir
from tokenfair.commands.common import (
    SWEEP_HELP,
    check_output_folder,
    check_policies,
    check_weights,
    console,
    fail,
    load_profile_option,
    read_trace_file,
    read_weights_file,
    say_failures,
    with_sweep,
)
from tokenfair.commands.simulate import (
    KvTokensOption,
    PrefixCachingOption,
    PresetOption,
    build_config,
)
from tokenfair.core.policies.loading import policy_label, split_policies
from tokenfair.experiments.experiment import (
    PAPER_POLICIES,
    WEIGHTED_POLICY,
    ExperimentResult,
    run_compare,
    run_paper_experiment,
)
from tokenfair.experiments.locality import (
    DEFAULT_SEEDS,
    LOCALITY_POLICIES,
    LocalityResult,
    run_locality_experiment,
)
from tokenfair.experiments.neighbor import SWEEP_PREFIX, NeighborRow
from tokenfair.experiments.paper_table import PAPER_ARENA_TABLE, PAPER_LABEL
from tokenfair.experiments.runner import DEFAULT_PROFILE, DEFAULT_WORKERS, ProgressFn
from tokenfair.experiments.summary import ratio
from tokenfair.experiments.workloads import ARENA

experiment_app = typer.Typer(
    help="Reproduce the paper's experiments and compare policies on a trace (simulated).",
    no_args_is_help=True,
)

# The paper's data: shipped with the package (tokenfair/bundled.py), or another folder.
SharedOption = Annotated[
    Path | None,
    typer.Option(
        help="A folder laid out as shared/ (traces/arena_vtc_600s.jsonl, reference/); "
        "default: the paper's data shipped with tokenfair."
    ),
]


def publish(result: ExperimentResult) -> None:
    """Write the report (markdown, HTML, figures). matplotlib is imported here, not when
    the CLI starts: every other command, `serve` and `gateway` among them, starts
    without it."""
    from tokenfair.report.experiment_report import publish as write_report

    write_report(result)


def paper_data(shared: Path | None) -> Path:
    """The folder to read the arena trace from; one line and exit 2 when it lacks it."""
    folder = data_dir(shared)
    if not (folder / "traces" / "arena_vtc_600s.jsonl").exists():
        fail(f"no arena trace under {folder}/traces: pass --shared DIR, a folder holding it")
    return folder


@contextmanager
def progress_bar(description: str) -> Iterator[ProgressFn]:
    """A rich progress bar on stderr, advanced by the experiment's progress callback."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[last]}"),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=None, last="")

        def advance(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, last=label)

        yield advance


def _ratio_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def results_table(result: ExperimentResult, workload: str) -> Table:
    """One workload's rows; on the arena trace with the paper's numbers beside ours."""
    rows = result.rows_for(workload)
    fcfs = next((r for r in rows if r.policy == "fcfs"), None)
    with_paper = workload == ARENA
    columns = ["scheduler", "Max Diff", "Avg Diff", "Diff Var", "tok/s", "Max÷FCFS", "tok/s÷FCFS"]
    cached = any(row.prefix_hit_rate is not None for row in rows)
    if cached:
        columns.append("prefix hit")
    if with_paper:
        columns += ["paper Max", "paper Avg", "paper tok/s"]
    title = f"{workload}: simulated" + (f" vs {PAPER_LABEL}" if with_paper else "")
    table = Table(*columns, title=title, box=box.SIMPLE_HEAD)
    for row in rows:
        cells = [
            row.label,
            f"{row.max_diff:.1f}",
            f"{row.avg_diff:.1f}",
            f"{row.diff_var:.0f}",
            f"{row.throughput_tok_s:.0f}",
            _ratio_text(ratio(row.max_diff, fcfs.max_diff) if fcfs else None),
            _ratio_text(ratio(row.throughput_tok_s, fcfs.throughput_tok_s) if fcfs else None),
        ]
        if cached:
            hits = row.prefix_hit_rate
            cells.append("–" if hits is None else f"{hits:.1%}")
        if with_paper:
            paper = PAPER_ARENA_TABLE.get(row.policy)
            cells += (
                [f"{paper.max_diff:.1f}", f"{paper.avg_diff:.1f}", f"{paper.throughput_tok_s:.0f}"]
                if paper
                else ["–", "–", "–"]
            )
        table.add_row(*cells)
    return table


def print_summary(result: ExperimentResult, workload: str) -> None:
    # Wide enough for the arena table even when piped (rich falls back to 80 columns).
    out = Console(width=None if Console().is_terminal else 132)
    out.print(results_table(result, workload))
    if result.targets:
        met = sum(t.passed is True for t in result.targets)
        evaluated = sum(t.passed is not None for t in result.targets)
        out.print(
            f"The paper's findings, as targets: {met} of {evaluated} reproduced by this run "
            "(simulated A10G; the paper measured a real one)."
        )
        for check in result.targets:
            if check.passed is False:
                out.print(
                    f"  not reproduced here, a finding of this run: {check.target}; "
                    f"measured {check.measured}",
                    markup=False,
                )
    if result.locality is not None:
        out.print(locality_table(result.locality))
    if result.neighbor:
        out.print(neighbor_table(result.neighbor))
    out.print(f"Report: {result.report_md} (and {result.report_html.name}), {result.wall_s:.0f} s")


def neighbor_table(rows: Sequence[NeighborRow]) -> Table:
    """The long-context neighbour's headline figures: the chat tenants' TTFT p99 and
    TPOT against alone, the long tenant's throughput against fcfs."""
    table = Table(
        "case",
        "run",
        "chat TTFT p99 (s)",
        "÷ alone",
        "chat TPOT p50 (s)",
        "long tenant ÷ fcfs",
        title="A tenant flooding long prompts beside chat tenants (engine preset)",
    )
    for row in rows:
        if row.run.startswith(SWEEP_PREFIX):
            continue
        table.add_row(
            row.case,
            row.run,
            f"{row.chat_ttft_p99_s:.3f}",
            "–" if row.ttft_p99_x_alone is None else f"{row.ttft_p99_x_alone:.1f}x",
            f"{row.chat_tpot_p50_s:.4f}",
            "–" if row.long_x_fcfs is None else f"{row.long_x_fcfs:.2f}",
        )
    return table


def locality_table(result: LocalityResult) -> Table:
    """The locality experiment's headline figures, one row per suite and policy."""
    table = Table(
        "suite",
        "policy",
        "throughput (tok/s)",
        "÷ vtc",
        "prefix hit rate",
        "Max Diff",
        "÷ vtc",
        "fluid ideal's Max Diff",
        title="Clients sharing prompt prefixes (engine preset, prefix caching on)",
    )
    for row in result.rows:
        vtc = result.row(row.suite, "vtc") if "vtc" in result.settings["policies"] else None
        table.add_row(
            row.suite,
            policy_label(row.policy),
            f"{row.throughput_tok_s:,.0f}",
            _ratio_text(row.throughput_tok_s / vtc.throughput_tok_s if vtc else None),
            f"{row.prefix_hit_rate:.0%}",
            f"{row.max_diff:,.1f}",
            _ratio_text(row.max_diff / vtc.max_diff if vtc and vtc.max_diff else None),
            f"{row.fluid_max_diff:,.1f}",
        )
    return table


def check_seeds(seeds: int) -> None:
    """One line, as every other mistake, rather than click's usage block."""
    if seeds < 1:
        fail(f"--seeds {seeds}: give at least 1 draw (seed 0 is the one the tables show)")


@experiment_app.command()
def paper(
    out: Annotated[Path, typer.Option(help="Folder for the report, figures and results.")] = Path(
        "out/paper"
    ),
    quick: Annotated[
        bool,
        typer.Option(
            help="Suites and ablation under fewer policies (the arena table stays complete)."
        ),
    ] = False,
    shared: SharedOption = None,
    workers: Annotated[int, typer.Option(help="Simulations run in parallel.")] = DEFAULT_WORKERS,
    policies: Annotated[
        str,
        typer.Option(
            help="More policies, comma-separated, run beside the paper's on the arena trace, "
            "every suite and the ablation: your own "
            "(mypkg.mod:MyPolicy(key=value, label='mine')) or built-in names."
        ),
    ] = "",
    sweep: Annotated[str | None, typer.Option(help=SWEEP_HELP)] = None,
    seeds: Annotated[
        int,
        typer.Option(
            help="Draws of every synthetic suite (seeds 0 .. N-1): the report adds each "
            "policy's mean and range over them (the tables keep seed 0).",
        ),
    ] = 1,
) -> None:
    """Run the paper's experiments: every synthetic suite and the arena trace under FCFS, LCF, VTC (+predict, +oracle), RPM(5/20/30), vtc-preempt and weighted VTC, plus the KV pool / request length ablation; write OUT/report.md and OUT/report.html with figures.

    \b
    Example: tokenfair experiment paper --quick --out experiments/paper
    """
    check_seeds(seeds)
    extra = split_policies(policies)
    check_policies(
        with_sweep(extra, sweep), [*PAPER_POLICIES, WEIGHTED_POLICY], "the paper experiment"
    )
    check_output_folder(out)
    folder = paper_data(shared)
    with progress_bar("paper experiment") as advance:
        result = run_paper_experiment(
            out,
            quick,
            folder,
            advance,
            workers=workers,
            extra_policies=extra,
            seeds=seeds,
            sweep=sweep,
        )
    publish(result)
    print_summary(result, ARENA)
    say_failures(result)


@experiment_app.command()
def compare(
    trace: Annotated[Path, typer.Option(help="Trace file (JSONL, one request a line).")],
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated policies, e.g. fcfs,vtc,rpm:20 (or your own: "
            "mypkg.mod:MyPolicy(key=value))."
        ),
    ] = "fcfs,vtc",
    out: Annotated[Path, typer.Option(help="Folder for the report, figures and results.")] = Path(
        "out/compare"
    ),
    profile: Annotated[str, typer.Option(help="Step-time profile name or JSON file.")] = (
        DEFAULT_PROFILE
    ),
    duration: Annotated[
        float | None, typer.Option(help="T in seconds (default: the last arrival).")
    ] = None,
    window: Annotated[float, typer.Option(help="w: the rate window in seconds.")] = 60.0,
    warmup: Annotated[float, typer.Option(help="Seconds skipped at the start.")] = 30.0,
    weights: Annotated[
        Path | None, typer.Option(help="JSON {client: weight}; adds wvtc to the policies.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Simulations run in parallel.")] = DEFAULT_WORKERS,
    preset: PresetOption = "paper",
    kv_tokens: KvTokensOption = None,
    prefix_caching: PrefixCachingOption = None,
    sweep: Annotated[str | None, typer.Option(help=SWEEP_HELP)] = None,
) -> None:
    """Replay a trace under several policies (simulated; the paper's system, or the engine preset) and write the same report, figures and per-request results as `experiment paper`.

    \b
    Example: tokenfair experiment compare --trace ../shared/traces/arena_vtc_600s.jsonl --policies fcfs,vtc,rpm:20 --out cmp
    """
    chosen = split_policies(policies)
    if not with_sweep(chosen, sweep):
        fail("--policies is empty: name at least one policy, e.g. fcfs,vtc")
    weighted = [WEIGHTED_POLICY] if weights and WEIGHTED_POLICY not in chosen else []
    check_policies(with_sweep(chosen, sweep), weighted, "this comparison")
    config = build_config(
        preset, kv_tokens, None, None, None, None, None, prefix_caching=prefix_caching
    )
    check_output_folder(out)
    records = read_trace_file(trace)
    load_profile_option(profile)
    client_weights = read_weights_file(weights)
    # Weights also weigh the metrics here, so only absent clients are worth a warning.
    check_weights(client_weights, {r.client for r in records})
    try:
        with progress_bar(f"compare {trace.name}") as advance:
            result = run_compare(
                trace,
                chosen,
                out,
                profile=profile,
                duration_s=duration,
                window_s=window,
                warmup_s=warmup,
                weights=client_weights,
                workers=workers,
                progress=advance,
                config=config,
                preset=preset,
                sweep=sweep,
            )
        publish(result)
    except (OSError, ValueError) as error:
        fail(str(error))
    print_summary(result, result.workloads[0].name)
    say_failures(result)


@experiment_app.command()
def locality(
    out: Annotated[Path, typer.Option(help="Folder for the report, figure and metrics.")] = Path(
        "out/locality"
    ),
    seeds: Annotated[
        int, typer.Option(help="Draws of each suite, averaged (Max Diff varies).")
    ] = len(DEFAULT_SEEDS),
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = ",".join(
        LOCALITY_POLICIES
    ),
    workers: Annotated[int, typer.Option(help="Simulations run in parallel.")] = DEFAULT_WORKERS,
) -> None:
    """Clients sharing prompt prefixes (the system-prompt and multiturn suites) on a vLLM-like engine with prefix caching and a small KV pool: throughput, prefix hit rate, Max Diff and the fluid fair-share ideal per policy; write OUT/report.md and OUT/report.html with a figure.

    \b
    Example: tokenfair experiment locality --out out/locality --seeds 3
    """
    check_seeds(seeds)
    chosen = split_policies(policies)
    if not chosen:
        fail("--policies is empty: name at least one policy, e.g. vtc,dlpm")
    check_policies(chosen, runner="the locality experiment")
    check_output_folder(out)
    with progress_bar("locality experiment") as advance:
        result = run_locality_experiment(
            out, seeds=range(seeds), policies=chosen, workers=workers, progress=advance
        )
    from tokenfair.report.locality_report import write_locality_report

    report = write_locality_report(result, out)
    Console(width=None if Console().is_terminal else 132).print(locality_table(result))
    print(f"Report: {report} (and report.html), {result.wall_s:.0f} s")


def run_demo(shared: Path | None, out_dir: Path) -> None:
    """What `make demo` runs: the quick paper experiment, the arena table, the report path."""
    check_output_folder(out_dir)
    folder = paper_data(shared)
    with progress_bar("paper experiment (quick)") as advance:
        result = run_paper_experiment(out_dir, True, folder, advance)
    publish(result)
    print_summary(result, ARENA)
