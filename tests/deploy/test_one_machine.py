"""docs/deploy.md's "One machine" section, run as written: its two files, then its
commands one by one (the ports moved to free ones), then a request through each
gateway replica with the official openai client."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.gateway.redis_server import REDIS_SERVER, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deploy.md"
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)
# The commands that keep running, and the port each one is up on when it is ready.
SERVERS = {"serve": "--port", "redis-server": "--port", "gateway": None}


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, code, the prose just before it) for each fenced block."""
    found, last = [], 0
    for match in FENCE.finditer(text):
        found.append((match.group(1), match.group(2), text[last : match.start()]))
        last = match.end()
    return found


def named_file(prose: str) -> str:
    """The file a YAML block is: the last `name.yaml` its prose names."""
    names = re.findall(r"`([\w.-]+\.ya?ml)`", prose)
    assert names, f"a YAML block whose file is not named: {prose[-200:]!r}"
    return names[-1]


def tool(name: str) -> str:
    if name == "tokenfair":
        return str(Path(sys.executable).parent / "tokenfair")
    if name == "redis-server":
        return REDIS_SERVER
    found = shutil.which(name)
    assert found, f"{name} is not installed"
    return found


@pytest.mark.slow
def test_the_one_machine_section_runs_as_written(tmp_path: Path) -> None:
    text = section(DOC.read_text(encoding="utf-8"), "One machine")
    ports = {port: str(free_port()) for port in sorted(set(re.findall(r"\b(\d{4})\b", text)))}
    moved = re.sub(r"\b(\d{4})\b", lambda m: ports[m.group(1)], text)
    code = blocks(moved)
    for language, body, prose in code:
        if language == "yaml":
            (tmp_path / named_file(prose)).write_text(body)
    (commands,) = [body for language, body, _ in code if language == "sh"]
    running: list[subprocess.Popen[bytes]] = []
    try:
        for line in commands.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            words[0] = tool(words[0])
            kind = next((k for k in SERVERS if k in line.split("#")[0]), None)
            if kind == "gateway" and "--check" in words:
                kind = None
            if kind is None:
                done = subprocess.run(
                    words, cwd=tmp_path, capture_output=True, text=True, timeout=60
                )
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                continue
            log = (tmp_path / f"{len(running)}.log").open("wb")
            running.append(subprocess.Popen(words, cwd=tmp_path, stdout=log, stderr=log))
            port = words[words.index("--port") + 1] if "--port" in words else ports["8080"]
            wait_for_port(int(port), timeout=60)
        from openai import OpenAI

        for port in (ports["8080"], ports["8081"]):
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="tf-try-team-a")
            answer = client.chat.completions.create(
                model="sim:a10g-llama-7b",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=4,
            )
            assert answer.choices[0].message.content is not None
            assert answer.usage is not None and answer.usage.completion_tokens == 4
        for port in (ports["9100"], ports["9101"]):  # each replica's metrics port
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
            assert health.status_code == 200, health.text
    finally:
        for process in reversed(running):
            process.terminate()
        for process in running:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
