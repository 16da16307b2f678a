"""Real processes on loopback for the gateway's tests: upstreams and gateways."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.gateway.redis_server import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1"}
GATEWAY_MAIN = "import typer; from tokenfair.commands.gateway import gateway; typer.run(gateway)"
KEYS = {
    "light": "key-light",
    "heavy": "key-heavy",
    "other": "key-other",
    "tight": "key-tight",
    "limited": "key-limited",
}
# The "tight" tenant runs under small limits.
TIGHT = {"max_waiting": 1, "max_tokens_per_request": 100}


class Process:
    def __init__(
        self,
        args: list[str],
        port: int,
        log: Path,
        metrics_port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args, self.port, self.log = args, port, log
        self.metrics_port = metrics_port  # a gateway's operator pages, without a key
        self.env = env or ENV
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> Process:  # generous: the machine may be busy
        out = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.args, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.args} exited: {self.log.read_text()[-2000:]}")
            try:
                wait_for_port(self.port, timeout=0.2)
                return self
            except TimeoutError:
                if time.monotonic() > deadline:
                    self.kill()  # never leave a half-started process behind
                    raise TimeoutError(
                        f"{self.args[-1]} did not listen on {self.port} in {timeout:.0f}s"
                    ) from None
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Where /metrics and the state pages are read (the API port without one)."""
        return f"http://127.0.0.1:{self.metrics_port or self.port}"

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def fake_upstream(
    tmp: Path, name: str, token_interval: float = 0.0, fail_status: int | None = None
) -> Process:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "tests.gateway.fake_upstream",
        "--port",
        str(port),
        "--token-interval",
        str(token_interval),
        "--name",
        name,
    ]
    if fail_status is not None:
        args += ["--fail-status", str(fail_status)]
    return Process(args, port, tmp / f"{name}.log").start()


def sim_upstream(tmp: Path, name: str, *options: str, profile: str = "fixed:0.01") -> Process:
    """`tokenfair serve --model sim:PROFILE` serving the model "sim"."""
    port = free_port()
    args = [
        sys.executable, "-c", "from tokenfair.cli import app; app()", "serve",
        "--model", f"sim:{profile}", "--served-model-name", "sim", "--port", str(port),
        "--log-level", "warning", *options,
    ]  # fmt: skip
    return Process(args, port, tmp / f"{name}.log").start(timeout=60)


def metrics(process: Process) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} from a process's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(process.metrics_url + "/metrics", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def tenants_file(tmp: Path, weights: dict[str, float] | None = None) -> Path:
    from tokenfair.edge.tenants import hash_key

    weights = weights or {}
    tenants = [
        {
            "name": name,
            "key_sha256": [hash_key(key)],
            "weight": weights.get(name, 1.0),
            "max_waiting": 1024,
            **(TIGHT if name == "tight" else {}),
            **({"rpm": 3} if name == "limited" else {}),
        }
        for name, key in KEYS.items()
    ]
    path = tmp / "tenants.yaml"
    path.write_text(yaml.safe_dump({"tenants": tenants}))
    return path


def gateway(
    tmp: Path,
    upstreams: list[dict[str, Any]],
    name: str = "gateway",
    cli: tuple[str, ...] = (),
    **settings: Any,
) -> Process:
    port, metrics_port = free_port(), free_port()
    config = {
        "listen": {"port": port, "metrics_port": metrics_port},
        "tenants": str(tenants_file(tmp)),
        "upstreams": upstreams,
        **settings,
    }
    config.setdefault("health", {"interval_s": 0.2, "timeout_s": 0.5, "fail_after": 1})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [
        sys.executable,
        "-c",
        # The gateway command alone: the whole CLI would also import plotting libraries.
        GATEWAY_MAIN,
        "--config",
        str(path),
        "--log-level",
        "warning",
        *cli,
    ]
    return Process(args, port, tmp / f"{name}.log", metrics_port).start()


def state(gateway: Process) -> dict[str, Any]:
    return httpx.get(gateway.metrics_url + "/v1/gateway/state", timeout=5).json()  # type: ignore[no-any-return]


def stats(upstream: Process) -> dict[str, Any]:
    return httpx.get(upstream.url + "/stats", timeout=5).json()  # type: ignore[no-any-return]
