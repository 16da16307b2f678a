"""Reads the Dockerfile's instructions, per build stage, as Docker's parser splits them.

Enough of the format for the checks in tests/deploy: comments dropped, lines joined at a
trailing backslash, one instruction per logical line, exec-form (JSON) arguments
decoded. It does not expand variables or evaluate the shell form.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, CMD, ...
    arguments: str  # the rest of the logical line, as written
    line: int  # where it starts in the file, from 1


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def last(self, keyword: str) -> Instruction | None:
        """The instruction in force: Docker applies the last CMD, USER, ... of a stage."""
        found = [i for i in self.instructions if i.keyword == keyword]
        return found[-1] if found else None

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    logical = ""
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not logical):
            continue  # comments may sit between continued lines too
        if not logical:
            start = number
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, arguments = logical.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip(), start)
        logical = ""
        if instruction.keyword == "FROM":
            words = instruction.arguments.split()
            words = [w for w in words if not w.startswith("--")]  # --platform=...
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            if instruction.keyword != "ARG":  # only ARG may come before the first FROM
                raise ValueError(f"{path}:{start}: {instruction.keyword} before any FROM")
        else:
            stages[-1].instructions.append(instruction)
    return stages


def exec_form(instruction: Instruction) -> list[str]:
    """The argument list of an exec-form (JSON) CMD, ENTRYPOINT or HEALTHCHECK CMD."""
    text = instruction.arguments
    if instruction.keyword == "HEALTHCHECK":
        # Options first (--interval=15s ...), then CMD and its arguments.
        match = re.fullmatch(r"(?:--\S+\s+)*CMD\s+(.*)", text, flags=re.DOTALL)
        if match is None:
            raise ValueError(f"line {instruction.line}: HEALTHCHECK without CMD")
        text = match.group(1)
    if not text.startswith("["):
        raise ValueError(f"line {instruction.line}: {instruction.keyword} is not in exec form")
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"line {instruction.line}: not a JSON list of strings")
    return value


def env(stage: Stage) -> dict[str, str]:
    """The environment a stage's ENV instructions set (the `KEY=VALUE ...` form)."""
    found: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for word in shlex.split(instruction.arguments):
            key, _, value = word.partition("=")
            found[key] = value
    return found


def healthcheck_options(instruction: Instruction) -> dict[str, str]:
    """HEALTHCHECK's options (interval, timeout, start-period, retries) as written."""
    options = {}
    for word in instruction.arguments.split():
        if not word.startswith("--"):
            break
        key, _, value = word[2:].partition("=")
        options[key] = value
    return options
