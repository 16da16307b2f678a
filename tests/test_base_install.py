"""The CLI as a base install (`pip install tokenfair`, no extra) meets it.

The suite runs with every extra installed, so an import of uvicorn or torch on the CLI's
path would pass every other test and still break a newcomer's first command. Here each
command runs in a process where the extras' packages cannot be imported
(tests/without_extras.py): the commands that need no extra work, and those that need one
name it in one line and exit 2.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tokenfair.commands.common import USAGE_ERROR

BLOCKER = Path(__file__).with_name("without_extras.py")
EVERY_EXTRA = "server,model,redis,dev"


def tokenfair(
    *args: str, block: str = EVERY_EXTRA, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BLOCKER), "--block", block, "--", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_the_blocker_blocks_every_extra() -> None:
    """What the other tests rely on: the extras' packages, and what only they bring in,
    are unimportable, and the base's are not."""
    probe = (
        "import importlib.util as u, runpy, sys; sys.argv = ['x', '--block', "
        f"'{EVERY_EXTRA}']; m = runpy.run_path({str(BLOCKER)!r}); "
        f"m['block_extras'](set({EVERY_EXTRA!r}.split(','))); "
        "print(*[n for n in ('uvicorn', 'fastapi', 'starlette', 'torch', 'transformers', "
        "'redis', 'yaml', 'httpx', 'pytest', 'numpy', 'pydantic', 'rich', 'matplotlib') "
        "if u.find_spec(n) is not None])"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert shown.stdout.split() == ["numpy", "pydantic", "rich", "matplotlib"]


def test_every_command_has_help_without_extras() -> None:
    result = subprocess.run(
        [sys.executable, str(BLOCKER), "--every-help"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checked = [line for line in result.stdout.splitlines() if line.startswith("ok tokenfair")]
    # The root, every command and every sub-command: a CLI that lost its commands fails.
    for command in ("serve", "gateway", "simulate", "demo", "experiment paper", "trace gen"):
        assert f"ok tokenfair {command}" in checked
    assert len(checked) >= 20


def test_the_entry_point_runs_without_extras() -> None:
    result = tokenfair("--help")
    assert result.returncode == 0, result.stderr
    assert "simulate" in result.stdout and "serve" in result.stdout


def test_simulate_metrics_policies_profiles_data_run_without_extras(tmp_path: Path) -> None:
    trace = tmp_path / "overload.jsonl"
    results = tmp_path / "results.jsonl"
    steps = [
        ("trace", "gen", "overload", "--out", str(trace)),
        ("simulate", "--trace", str(trace), "--policy", "vtc", "--out", str(results)),
        ("metrics", str(results)),
        ("policies",),
        ("profiles",),
        ("data",),
    ]
    for step in steps:
        result = tokenfair(*step, cwd=tmp_path)
        assert result.returncode == 0, (step, result.stderr[-3000:])
        assert "Traceback" not in result.stderr
    assert results.stat().st_size > 0


def _one_line_refusal(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == USAGE_ERROR, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]


@pytest.mark.parametrize(
    ("args", "block", "expected"),
    [
        (
            ("serve",),
            EVERY_EXTRA,
            "tokenfair serve needs the server extra: pip install 'tokenfair[server]'",
        ),
        (("serve", "--model", "sim:a10g-llama-7b"), "server", "needs the server extra"),
        # Without --model, serve runs builtin:tiny, a real (random) model: torch is needed.
        (
            ("serve",),
            "model",
            "tokenfair serve --model builtin:tiny needs the model extra: pip install 'tokenfair[model]'",
        ),
        (("generate", "--prompt", "hi"), "model", "tokenfair generate needs the model extra"),
        (("profile",), "model", "tokenfair profile needs the model extra"),
        (("gateway", "--check"), "server", "tokenfair gateway needs the server extra"),
        (("tenants", "check", "tenants.yaml"), "server", "needs the server extra"),
        (("tenants", "hash-key"), "server", "needs the server extra"),
    ],
)
def test_a_command_that_needs_an_extra_names_it(
    args: tuple[str, ...], block: str, expected: str, tmp_path: Path
) -> None:
    _one_line_refusal(tokenfair(*args, block=block, cwd=tmp_path), expected)


def test_the_gateway_with_redis_needs_the_redis_extra(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "redis: {url: 'redis://127.0.0.1:1/0'}\n"
        "upstreams:\n  - {url: 'http://127.0.0.1:1', models: [m], max_concurrent: 2}\n"
    )
    result = tokenfair("gateway", "--config", str(config), "--check", block="redis", cwd=tmp_path)
    _one_line_refusal(result, "needs the redis extra: pip install 'tokenfair[redis]'")


def test_the_cli_starts_without_matplotlib() -> None:
    """Only the report commands draw: `serve` and `gateway` start without matplotlib
    (a quarter of a second, and a writable config folder it wants)."""
    probe = "import sys, tokenfair.cli; print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert shown.stdout.strip() == "[]"
