"""The `tokenfair` command: one sub-command per module under tokenfair.commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenfair import __version__
from tokenfair.commands.experiment import SharedOption, experiment_app
from tokenfair.commands.gateway import gateway as gateway_command
from tokenfair.commands.metrics import metrics
from tokenfair.commands.model import generate, profile
from tokenfair.commands.serve import serve
from tokenfair.commands.simulate import simulate
from tokenfair.commands.tenants import tenants_app
from tokenfair.commands.trace import trace_app
from tokenfair.core.policies import POLICY_HELP

app = typer.Typer(
    help="tokenfair: fair-share scheduling for multi-tenant LLM inference (Virtual Token Counter).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: brackets such as [model] print as written, flags without type noise.
    rich_markup_mode=None,
)
app.command()(simulate)
app.command()(metrics)
app.command()(generate)
app.command("profile")(profile)
app.add_typer(trace_app, name="trace")
app.add_typer(experiment_app, name="experiment")
app.command("gateway")(gateway_command)
app.add_typer(tenants_app, name="tenants")
app.command("serve")(serve)


def _print_version(value: bool) -> None:
    if value:
        print(f"tokenfair {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    """tokenfair: fair-share scheduling for multi-tenant LLM inference (Virtual Token Counter)."""


@app.command()
def policies() -> None:
    """List the scheduling policies by name: the built-in ones, then those installed
    under the `tokenfair.policies` entry point group. Any policy class can also be
    named as package.module:ClassName(key=value, ...) (docs/policies.md).

    \b
    Example: tokenfair policies
    """
    from tokenfair.core.policies.loading import installed_policies

    table = Table("policy", "what it does")
    for name, text in POLICY_HELP.items():
        table.add_row(name, text)
    for name, text in installed_policies().items():
        table.add_row(f"{name} (installed)", text)
    Console().print(table)


@app.command()
def profiles() -> None:
    """List the shipped simulator step-time profiles.

    \b
    Example: tokenfair profiles
    """
    from tokenfair.engine.sim.profile import builtin_profiles, load_profile

    table = Table("profile", "description")
    for name in builtin_profiles():
        table.add_row(name, getattr(load_profile(name), "description", ""))
    Console().print(table)


@app.command()
def data(
    name: Annotated[
        str | None, typer.Argument(help="A dataset's name: print only its path.")
    ] = None,
) -> None:
    """List the data shipped with tokenfair (the paper's arena trace and its measured
    A10G run): name, records, path. With a name, print only that file's path, for a
    script: `tokenfair simulate --trace "$(tokenfair data arena)"`.

    \b
    Example: tokenfair data
    """
    from tokenfair.bundled import DATASETS, dataset
    from tokenfair.commands.common import fail

    if name is not None:
        try:
            print(dataset(name).path)
        except ValueError as error:
            fail(str(error))
        return
    table = Table("name", "records", "what it is")
    table.add_column("path", overflow="fold")  # whole, however narrow the terminal
    for found in DATASETS:
        with found.path.open("rb") as lines:
            records = sum(1 for line in lines if line.strip())
        table.add_row(found.name, f"{records:,}", found.what, str(found.path))
    Console().print(table)


@app.command()
def demo(
    shared: SharedOption = None,
    out: Annotated[Path, typer.Option(help="Where the report and figures go.")] = Path("out/demo"),
) -> None:
    """Run the paper experiment (quick): the arena trace under every policy, each paper
    suite under FCFS and VTC (weighted VTC on the weighted suite) and the ablation, then
    print the arena table, which of the paper's findings this run reproduces, and where
    the report (markdown, HTML, PNG) is.

    \b
    Example: tokenfair demo --out out/demo
    """
    from tokenfair.commands.experiment import run_demo

    run_demo(shared, out)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
