"""Real servers on free loopback ports, started as `tokenfair serve` subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tokenfair.edge.tenants import hash_key

SRC = Path(__file__).resolve().parents[2] / "src"
KEYS = {"team-a": "key-a", "team-b": "key-b", "team-c": "key-c", "slow": "key-slow"}
ADMIN_KEY = "admin-key"


def tenants_data() -> dict[str, object]:
    return {
        "admin_key_sha256": hash_key(ADMIN_KEY),
        "tenants": [
            {"name": "team-a", "key_sha256": [hash_key(KEYS["team-a"])]},
            {"name": "team-b", "key_sha256": [hash_key(KEYS["team-b"])], "weight": 2.0},
            {
                "name": "team-c",
                "key_sha256": [hash_key(KEYS["team-c"])],
                "max_waiting": 2,
                "rpm": 5,
                "max_tokens_per_request": 64,
            },
            {"name": "slow", "key_sha256": [hash_key(KEYS["slow"])], "timeout_s": 0.3},
        ],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def headers(self, tenant: str = "team-a") -> dict[str, str]:
        return {"Authorization": f"Bearer {KEYS[tenant]}"}

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """{(sample name, sorted labels): value} from /metrics."""
        # The admin key: with a tenants file, /metrics on the API port is the operator's.
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        text = httpx.get(f"{self.url}/metrics", headers=admin, timeout=30).text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return values

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def launch(
    tmp: Path,
    *args: str,
    tenants: dict[str, object] | None = None,
    timeout: float = 120,
    python_path: tuple[Path, ...] = (),
) -> Server:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tokenfair.cli",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if tenants is not None:
        path = tmp / f"tenants-{port}.yaml"
        path.write_text(yaml.safe_dump(tenants))
        command += ["--tenants", str(path)]
    command += list(args)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (SRC, *python_path)))}
    log = tmp / f"server-{port}.log"
    process = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server did not come up: {log.read_text()}")


@pytest.fixture(scope="session")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def sim_server(server_dir: Path) -> Iterator[Server]:
    """sim: with 2 ms steps, the test tenants, VTC."""
    server = launch(
        server_dir, "--model", "sim:fixed:0.002", "--policy", "vtc", tenants=tenants_data()
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sim_process_server(server_dir: Path) -> Iterator[Server]:
    """The same as sim_server, its engine in a process of its own (sim's default is a
    thread; real models' is the process)."""
    server = launch(
        server_dir,
        "--model", "sim:fixed:0.002", "--policy", "vtc", "--engine", "process",
        tenants=tenants_data(),
    )  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(params=["thread", "process"])
def any_sim_server(request: pytest.FixtureRequest) -> Server:
    """sim_server and sim_process_server in turn."""
    name = "sim_server" if request.param == "thread" else "sim_process_server"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


def engine_processes(server: Server) -> list[int]:
    """The server's child processes that are its engine."""
    pid = server.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [
        int(child)
        for child in children
        if b"tokenfair.engine.engine_core" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]


@pytest.fixture(scope="session")
def tiny_server(server_dir: Path) -> Iterator[Server]:
    """builtin:tiny on the CPU with prefix caching, the test tenants."""
    pytest.importorskip("torch")
    server = launch(
        server_dir,
        "--model", "builtin:tiny", "--device", "cpu", "--kv-tokens", "8192",
        "--enable-prefix-caching",
        tenants=tenants_data(),
    )  # fmt: skip
    yield server
    server.stop()
