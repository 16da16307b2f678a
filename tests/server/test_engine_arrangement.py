"""`tokenfair serve --engine`: where the engine steps, and a bad choice refused."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.server.conftest import SRC, engine_processes, launch
from tokenfair.commands.serve import engine_arrangement


def test_auto_puts_real_models_in_a_process_and_sim_on_a_thread():
    assert engine_arrangement("auto", "builtin:tiny") == "process"
    assert engine_arrangement("auto", "/models/llama") == "process"
    assert engine_arrangement("auto", "sim:fixed:0.01") == "thread"
    assert engine_arrangement("thread", "builtin:tiny") == "thread"
    assert engine_arrangement("process", "sim:zero") == "process"


def test_each_server_runs_the_arrangement_it_was_given(sim_server, sim_process_server):
    assert engine_processes(sim_server) == []
    (child,) = engine_processes(sim_process_server)
    assert child > 0


def test_the_engine_process_stops_with_the_server(server_dir):
    server = launch(server_dir, "--model", "sim:fixed:0.002", "--engine", "process")
    (child,) = engine_processes(server)
    body = {"model": "sim:fixed:0.002", "prompt": "x", "max_tokens": 3}
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).status_code == 200
    server.stop()  # SIGINT, as Ctrl-C
    assert server.process.returncode is not None
    with pytest.raises(FileNotFoundError):
        open(f"/proc/{child}/cmdline").close()  # reaped: the server waited for it


def test_a_bad_engine_choice_names_the_option():
    done = subprocess.run(
        [sys.executable, "-m", "tokenfair.cli", "serve", "--model", "sim:zero", "--engine", "gpu"],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"--engine must be one of auto, process, thread" in done.stderr
    assert b"Traceback" not in done.stderr


def test_a_model_that_cannot_load_in_the_engine_process_is_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "tokenfair.cli", "serve", "--model", "sim:no-such-profile",
         "--engine", "process"],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert b"no-such-profile" in done.stderr
    assert b"Traceback" not in done.stderr
