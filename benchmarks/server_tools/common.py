"""Helpers shared by the server benchmarks: start/stop servers, run the load generator.

Every process runs under `nice -n 10`. The load generator (server_tools/loadgen.py) always runs
in its own process, as a client would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
LOADGEN = ROOT / "benchmarks" / "server_tools" / "loadgen.py"
OUT = ROOT / "out" / "bench-server"


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    def __init__(self, command: list[str], env: dict[str, str], log: Path, url: str) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.url = url
        self.log = log
        self.process = subprocess.Popen(
            ["nice", "-n", "10", *command],
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited; see {self.log}:\n{self.log.read_text()[-2000:]}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout} s; see {self.log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def tokenfair_server(*args: str, python: str = sys.executable, timeout: float = 180) -> Process:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [
        python,
        "-m",
        "tokenfair.cli",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    server = Process(command, env, OUT / f"tokenfair-{port}.log", f"http://127.0.0.1:{port}")
    server.wait_healthy(timeout)
    return server


def loadgen(url: str, model: str, *args: str) -> subprocess.Popen[bytes]:
    """Start the load generator; `finish()` its result."""
    command = [
        "nice",
        "-n",
        "10",
        sys.executable,
        str(LOADGEN),
        "--url",
        url,
        "--model",
        model,
        *args,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE)


def finish(process: subprocess.Popen[bytes]) -> dict[str, object]:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"load generator failed ({process.returncode})")
    return json.loads(out.decode().strip().splitlines()[-1])


def run_load(url: str, model: str, *args: str) -> dict[str, object]:
    return finish(loadgen(url, model, *args))


def emit(record: dict[str, object]) -> None:
    print(json.dumps({**record, "load_avg_1m": load_average()}), flush=True)
