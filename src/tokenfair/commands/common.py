"""What every `tokenfair` command shares: one-line errors and warnings, and the checks of
inputs (files, output paths, weights, profiles, devices) done before any work starts.

The rule for users' mistakes: one line on stderr naming the file, line or option, exit
status 2, never a traceback. The rule for empty inputs, in every command: a trace or a
results file without a single request is an error (there is nothing to replay or
score), as is a conversion that keeps no request.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from tokenfair.engine.sim.profile import StepTimeProfile
    from tokenfair.experiments.experiment import ExperimentResult
    from tokenfair.results import ResultRecord
    from tokenfair.workloads.trace import TraceRecord
    from tokenfair.workloads.weights import ClientShares

console = Console(stderr=True, highlight=False, soft_wrap=True)
USAGE_ERROR = 2

# `tokenfair serve` and `tokenfair gateway` stop alike (uvicorn's graceful shutdown).
ShutdownTimeout = Annotated[
    int,
    typer.Option(
        help="On SIGTERM or Ctrl-C, seconds the requests in flight get to finish; "
        "then they end with a 503 (an error event in a stream)."
    ),
]

# The log lines of `tokenfair serve` and `tokenfair gateway` (uvicorn's too: they start
# with no log config of uvicorn's own, so its lines reach the root logger).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# What each extra brings that a command imports: the top-level modules to look for, so a
# command that needs an extra says which one before it imports anything of it.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "httpx", "prometheus_client", "yaml", "orjson"),
    "model": ("torch", "transformers", "safetensors"),
    "redis": ("redis",),
}


SHARE_SEATS_HELP = (
    "When every seat is taken, a tenant over its weighted share of the seats gives one up "
    "to a tenant waiting for one (VTC policies; docs/fairness.md)."
)
SHARE_MEMORY_HELP = (
    "KV memory shared by weight: a tenant within its share of the pool waiting for memory "
    "takes it from the tenant furthest over its share, and memory victims are that "
    "tenant's (VTC policies; docs/fairness.md)."
)
STEP_SHARE_HELP = (
    "While another tenant has work, one tenant's prompt chunks take at most this many "
    "tokens of a step; 0: no limit (docs/fairness.md)."
)


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that cannot be imported here."""
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def require_extra(command: str, extra: str, hint: str = "") -> None:
    """Leave with one line and status 2 when `extra` is not installed: `command` is what
    the user ran (`tokenfair serve`), `hint` an alternative that needs no extra."""
    missing = missing_modules(extra)
    if not missing:
        return
    # A partial install names what it lacks; a missing extra is named as a whole.
    lacking = (
        f" ({', '.join(missing)} not installed)" if missing != list(EXTRA_MODULES[extra]) else ""
    )
    fail(f"{command} needs the {extra} extra: pip install 'tokenfair[{extra}]'{lacking}{hint}")


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and leave with status 2."""
    console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code=USAGE_ERROR)


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {escape(message)}")


def note(message: str) -> None:
    console.print(f"[dim]{escape(message)}[/dim]")


def describe_os_error(error: OSError) -> str:
    """`path: No such file or directory`, without Python's `[Errno 2]`."""
    if error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error)


@contextmanager
def user_errors(*extra: type[Exception]) -> Iterator[None]:
    """Turn the errors a user's input can cause into one line and exit status 2."""
    caught: tuple[type[Exception], ...] = (ValueError, *extra)
    try:
        yield
    except OSError as error:
        fail(describe_os_error(error))
    except caught as error:
        fail(str(error))


def check_output_file(path: Path | None, option: str = "--out") -> None:
    """Before any work: the output must be a file path whose folder can hold it."""
    if path is None:
        return
    if path.is_dir():
        fail(f"{option} {path} is a folder: give a file path, e.g. {path / 'out.jsonl'}")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        fail(f"{option} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        fail(f"{option} {path}: cannot write under {parent}")
    if path.exists() and not os.access(path, os.W_OK):
        fail(f"{option} {path}: the file is not writable")
    # The folder is made now, so a long run cannot fail at the end for want of it.
    with user_errors():
        path.parent.mkdir(parents=True, exist_ok=True)


def check_output_folder(path: Path, option: str = "--out") -> None:
    if path.exists() and not path.is_dir():
        fail(f"{option} {path} is a file: give a folder for the report and results")


def read_trace_file(path: Path, option: str = "--trace") -> list[TraceRecord]:
    """A trace file's requests; an unreadable, invalid or empty file is an error."""
    from tokenfair.workloads.trace import read_trace

    if path.is_dir():
        fail(f"{option} {path} is a folder: give a trace file (JSONL)")
    with user_errors():
        records = read_trace(path)
    if not records:
        fail(f"{path}: the trace holds no requests")
    return records


def read_results_file(path: Path) -> list[ResultRecord]:
    """A results file's records; an unreadable, invalid or empty file is an error."""
    from tokenfair.results import read_results

    if path.is_dir():
        fail(f"{path} is a folder: give a results file (JSONL, from simulate --out)")
    with user_errors():
        records = read_results(path)
    if not records:
        fail(f"{path}: the results file holds no requests")
    if all(r.first_token_s is None and r.finish_s is None for r in records):
        fail(
            f"{path}: no request has a first_token_s or finish_s: this looks like a trace, "
            "not per-request results (results come from `tokenfair simulate --out FILE`)"
        )
    return records


def read_shares_file(path: Path | None) -> ClientShares | None:
    """A weights file, flat or a tree of groups, or None without a file."""
    from tokenfair.workloads.weights import read_shares

    if path is None:
        return None
    with user_errors():
        return read_shares(path)


def read_weights_file(path: Path | None) -> dict[str, float] | None:
    """A weights file's client weights (flat or a tree), or None without a file."""
    from tokenfair.workloads.weights import read_weights

    if path is None:
        return None
    with user_errors():
        return read_weights(path)


def check_weights(
    weights: Mapping[str, float] | None, clients: Iterable[str], policies: Iterable[str] = ()
) -> None:
    """Warn about weights that cannot matter: for clients absent from the trace, or given
    to `policies` that ignore them (pass none where weights also weigh the metrics)."""
    from tokenfair.core.policies.registry import uses_weights

    if not weights:
        return
    present = set(clients)
    absent = sorted(c for c in weights if c not in present)
    if absent:
        shown = ", ".join(absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
        warn(f"--weights names {len(absent)} client(s) absent from the trace: {shown}")
    ignoring = [p for p in policies if not uses_weights(p)]
    if ignoring:
        warn(f"--weights has no effect on {', '.join(ignoring)}: the policy ignores weights")


def load_profile_option(name: str) -> StepTimeProfile:
    """A shipped profile by name or a profile JSON file; anything else is one line."""
    from tokenfair.engine.sim.profile import load_profile, profile_from_json

    path = Path(name)
    if path.is_dir():
        fail(f"--profile {name} is a folder: give a profile name or JSON file")
    if path.suffix != ".json":
        with user_errors():
            return load_profile(name)
    if not path.is_file():
        fail(f"--profile {name}: no such file")
    with user_errors():
        text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        fail(f"--profile {name}:{error.lineno}: not JSON: {error.msg}")
    if not isinstance(data, dict):
        fail(f"--profile {name}: expected a JSON object (a profile written by tokenfair profile)")
    try:
        return profile_from_json(data)
    except (TypeError, ValueError) as error:
        fail(
            f"--profile {name} is not a step-time profile ({error}); write one with "
            "`tokenfair profile --out FILE` or name a shipped one (`tokenfair profiles`)"
        )


def check_device(device: str | None) -> None:
    """Refuse a device this torch cannot use before loading any model."""
    if device is None:
        return
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda"):
        fail(f"--device {device}: expected cpu, cuda or cuda:N")
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            build = torch.__version__
            fail(f"--device {device}: this torch ({build}) sees no CUDA GPU; use --device cpu")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            fail(f"--device {device}: there are {torch.cuda.device_count()} CUDA device(s)")


def check_policies(
    policies: list[str], running: Iterable[str] = (), runner: str = "this experiment"
) -> None:
    """Each builds (else its one-line error), and no two are called alike in reports,
    nor like one of `running`, the policies the experiment (`runner`) runs of its own."""
    from tokenfair.core.policies import PolicyError, make_policy
    from tokenfair.experiments.naming import PolicyClash, check_policy_specs

    for name in policies:
        try:
            make_policy(name, weights={"_": 1.0})
        except (PolicyError, ValueError) as error:
            fail(str(error))
    try:
        check_policy_specs(policies, list(running), runner)
    except PolicyClash as error:
        fail(str(error))


def say_failures(result: ExperimentResult) -> None:
    """A policy that failed: one line each, after the others' results were written;
    the command then exits 1."""
    if result.failures:
        for line in result.failures:
            console.print(f"[red]error:[/red] {escape(line)}")
        raise typer.Exit(code=1)


SWEEP_HELP = (
    "A policy of your own over a grid of its arguments, each given as a list taking "
    'each of its values: "mypkg.fair:DecayVTC(half_life_s=[10, 30, 120])" runs three.'
)


def with_sweep(policies: list[str], sweep: str | None) -> list[str]:
    """`policies` and the points of the `--sweep` spec (its one-line error if bad)."""
    if not sweep:
        return policies
    from tokenfair.core.policies import PolicyError
    from tokenfair.core.policies.loading import sweep_specs

    try:
        return [*policies, *sweep_specs(sweep)]
    except PolicyError as error:
        fail(f"--sweep: {error}")
