"""The gateway's probes and the image's HEALTHCHECK against a real gateway process,
started with the Deployment's own arguments and the files its pod mounts.

What the probes are for: readiness (/health on the API port) turns 503 when no upstream
is in rotation, so the Service stops sending clients to that replica; liveness (/metrics
on the metrics port) stays 200 meanwhile, so an engine that is down never gets the
gateways restarted. HEALTHCHECK follows /health.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import yaml

from tests.deploy import dockerfile
from tests.deploy.manifests import ROOT, argv, image_stages, in_root, lay_out_mounts, one, option

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0  # nothing answers


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def probe_url(container: dict, probe: str, ports: dict[int, int]) -> str:
    """The URL the kubelet asks, on the ports this test gave the gateway."""
    get = container[probe]["httpGet"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = named.get(get["port"], get["port"])
    return f"http://127.0.0.1:{ports[port]}{get['path']}"


def healthcheck(port: int) -> subprocess.CompletedProcess:
    """The image's HEALTHCHECK command, run as Docker runs it in the container."""
    command = dockerfile.exec_form(image_stages()["tokenfair"].last("HEALTHCHECK"))
    assert command[0] == "python"
    return subprocess.run(
        [sys.executable, *command[1:]],
        capture_output=True,
        text=True,
        timeout=30,
        env={**ENV, "HEALTHCHECK_PORT": str(port)},
    )


def test_probes_and_healthcheck_follow_the_upstreams(rendered, tmp_path):
    objects = rendered["base"]
    deployment = one(objects, "Deployment", "tokenfair-gateway")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    root = tmp_path / "pod"
    lay_out_mounts(objects, deployment, container, root)
    command_line = argv(container)
    config_path = in_root(root, option(command_line, "--config"))

    # The deployed config, changed only where this machine differs from the cluster:
    # loopback and free ports, the upstream here, no Redis (one replica), quick checks.
    config = yaml.safe_load(config_path.read_text())
    api, metrics = config["listen"]["port"], config["listen"]["metrics_port"]
    ports = {api: free_port(), metrics: free_port()}
    upstream_port = free_port()
    config["listen"] = {"host": "127.0.0.1", "port": ports[api], "metrics_port": ports[metrics]}
    config["upstreams"][0]["url"] = f"http://127.0.0.1:{upstream_port}/v1"
    del config["redis"]
    config["health"] = {"interval_s": 0.2, "timeout_s": 0.5, "fail_after": 1}
    config_path.write_text(yaml.safe_dump(config))

    # An upstream whose /health answers 200: a static file server holding a file `health`.
    served = tmp_path / "upstream"
    served.mkdir()
    (served / "health").write_text("ok")
    upstream = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(upstream_port), "--bind", "127.0.0.1"],
        cwd=served,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    args = [*command_line[1:]]
    args[args.index("--config") + 1] = str(config_path)
    readiness = probe_url(container, "readinessProbe", ports)
    liveness = probe_url(container, "livenessProbe", ports)
    log_path = tmp_path / "gateway.log"
    gateway = None
    try:
        with log_path.open("wb") as log:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "tokenfair.cli", *args],
                env={**ENV, **dockerfile.env(image_stages()["tokenfair"])},  # the image's ENV
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(
            lambda: status(f"http://127.0.0.1:{upstream_port}/health") == 200, 30, "upstream"
        )
        wait_until(lambda: status(readiness) == 200, 60, "the gateway never became ready")
        assert status(liveness) == 200
        healthy = healthcheck(ports[api])
        assert healthy.returncode == 0, healthy.stderr

        stop(upstream)  # the engine goes away: not ready, still alive
        wait_until(lambda: status(readiness) == 503, 30, "still ready without an upstream")
        assert status(liveness) == 200
        unhealthy = healthcheck(ports[api])
        assert unhealthy.returncode == 1
        assert "unhealthy" in unhealthy.stderr
    finally:
        stop(upstream)
        if gateway is not None:
            stop(gateway)
    # SIGTERM ends it within the shutdown timeout the Deployment gives it, gracefully (it
    # then re-raises the signal, so the exit status says SIGTERM, as the kubelet expects).
    output = log_path.read_text()
    assert gateway.returncode in (0, -signal.SIGTERM), output[-3000:]
    assert "Application shutdown complete" in output
