"""The benchmarks' load generator against a real server: every request it reports was
served, in both its closed and its open loop (the server's figures rest on it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import ADMIN_KEY, KEYS, Server

LOADGEN = Path(__file__).resolve().parents[2] / "benchmarks" / "server_tools" / "loadgen.py"


def run_loadgen(server: Server, ids: Path, *args: str) -> dict[str, object]:
    command = [
        sys.executable, str(LOADGEN), "--url", server.url, "--model", "sim:fixed:0.002",
        "--key", KEYS["team-a"], "--stream", "--max-tokens-min", "2", "--max-tokens", "6",
        "--ids-out", str(ids), *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, timeout=120, check=True)
    return dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))


def served(server: Server, ids: Path) -> dict[str, int]:
    """completion_tokens per response id the load generator recorded, as the server saw it."""
    rows = httpx.get(
        f"{server.url}/admin/requests/recent",
        params={"limit": 2048},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ).json()["data"]
    tokens = {row["id"]: row["completion_tokens"] for row in rows}
    recorded = [json.loads(line)["id"] for line in ids.read_text().splitlines()]
    assert len(set(recorded)) == len(recorded)
    return {rid: tokens[rid] for rid in recorded}


@pytest.mark.parametrize(
    "mode", [("--concurrency", "4"), ("--rate", "1000", "--concurrency", "1", "--seed", "7")]
)
def test_every_reported_request_was_served(
    sim_server: Server, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    ids = tmp_path / "ids.jsonl"
    result = run_loadgen(sim_server, ids, "--requests", "40", *mode)
    assert result["requests"] == 40 and result["errors"] == {}
    tokens = served(sim_server, ids)
    assert len(tokens) == 40
    assert set(tokens.values()) <= set(range(2, 7)) and len(set(tokens.values())) > 1
    if "--rate" in mode:
        # 40 arrivals in about 40 ms, one in flight at most, each at least two 2-ms steps
        # long: most of them find the one seat taken.
        assert result["rate_per_s"] == 1000.0
        assert isinstance(result["waited_for_cap"], int) and result["waited_for_cap"] > 0
