"""A real redis-server on a free loopback port, for the gateway's tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

# `make test` installs the Debian package when none is found; TOKENFAIR_REDIS_SERVER
# names another binary.
REDIS_SERVER = (
    os.environ.get("TOKENFAIR_REDIS_SERVER")
    or shutil.which("redis-server")
    or "/usr/bin/redis-server"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class RedisServer:
    """Start, stop and restart one redis-server (no persistence) on a fixed port."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def freeze(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (a hung Redis)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


def commands_run(url: str) -> dict[str, int]:
    """The commands Redis ran since its statistics were last reset (CONFIG RESETSTAT),
    those inside scripts included; the test's own, handshakes and subscriptions left out."""
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return {
        k: v
        for k, v in calls.items()
        if k not in ("config|resetstat", "subscribe", "info", "hello")
    }
