"""Run the `tokenfair` CLI as a base install would, in an environment that has every extra.

    python tests/without_extras.py [--block server,model,redis,dev] -- ARGS...
    python tests/without_extras.py --every-help

The second form runs `--help` of every command and sub-command the CLI has, printing
`ok PATH` for each or the traceback that stopped it.

Every module that the named extras bring, and that the base install does not, is made
unimportable (a None in sys.modules: `import uvicorn` raises ModuleNotFoundError and
`importlib.util.find_spec("uvicorn")` answers None, exactly as when it is absent). The
extras' packages are read from tokenfair's own metadata and followed through their
dependencies, so a package added to an extra is blocked without touching this file, and
a package that only an extra pulls in (starlette under fastapi) is blocked too.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import sys
from typing import Any

from packaging.requirements import Requirement


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def closure(requirements: list[Requirement], extras: set[str]) -> set[str]:
    """The distributions `requirements` install here, with their dependencies."""
    seen: set[str] = set()
    stack = [r for r in requirements if _applies(r, extras)]
    while stack:
        requirement = stack.pop()
        name = _name(requirement.name)
        if name in seen:
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        wanted = set(requirement.extras)
        stack.extend(r for r in map(Requirement, dist.requires or []) if _applies(r, wanted))
    return seen


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    if not extras:
        return requirement.marker.evaluate({"extra": ""})
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras)


def blocked_modules(blocked_extras: set[str]) -> set[str]:
    """The top-level modules that `blocked_extras` bring and that neither the base nor
    an extra left installed needs (blocking the model extra leaves yaml to the server's)."""
    tokenfair = metadata.distribution("tokenfair")
    own = [Requirement(r) for r in tokenfair.requires or []]
    optional = [r for r in own if r.marker is not None]
    kept_extras = set(tokenfair.metadata.get_all("Provides-Extra") or []) - blocked_extras
    kept = closure([r for r in own if r.marker is None], set()) | closure(optional, kept_extras)
    blocked = closure(optional, blocked_extras) - kept
    modules = set()
    for module, dists in metadata.packages_distributions().items():
        names = {_name(d) for d in dists}
        if names & blocked and not names & kept and module.isidentifier():
            modules.add(module)
    return modules


def block_extras(extras: set[str]) -> None:
    for module in blocked_modules(extras):
        if module not in sys.modules:
            sys.modules[module] = None  # type: ignore[assignment]


def every_help() -> int:
    """`--help` of each command in-process, one line each; the number that failed."""
    import traceback

    import typer.main

    from tokenfair.cli import app

    def paths(command: Any, path: list[str]) -> list[list[str]]:
        found = [path]
        for name, sub in getattr(command, "commands", {}).items():
            found += paths(sub, [*path, name])
        return found

    root = typer.main.get_command(app)
    failed = 0
    for path in paths(root, []):
        try:
            root.main([*path, "--help"], prog_name="tokenfair", standalone_mode=False)
            print("ok", " ".join(["tokenfair", *path]))
        except Exception:
            failed += 1
            print("FAILED", " ".join(["tokenfair", *path]))
            traceback.print_exc()
    return failed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", default="server,model,redis,dev")
    parser.add_argument("--every-help", action="store_true")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    block_extras(set(options.block.split(",")))
    if options.every_help:
        sys.exit(1 if every_help() else 0)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    from tokenfair.cli import app

    app(args, prog_name="tokenfair")


if __name__ == "__main__":
    main()
