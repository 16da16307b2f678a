"""At the default log level, the server and the gateway log their start, their
upstreams and their problems, never a line per request: uvicorn's access log is off
(a line per request is a third of the gateway's short requests/s, and operators who want
one have their proxy's or the JSON request stats). Every line has its time, and each
process's start is one line that says what it serves."""

from __future__ import annotations

import re
from pathlib import Path

import openai

from tests.gateway.processes import KEYS, gateway, sim_upstream

STAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \S+: ")


def test_no_access_log_line_per_request_at_the_default_level(tmp_path: Path) -> None:
    server = sim_upstream(tmp_path, "server", "--log-level", "info")
    front = gateway(
        tmp_path,
        [{"url": server.url, "models": ["sim"], "max_concurrent": 8}],
        cli=("--log-level", "info"),
    )
    try:
        for process in (server, front):
            client = openai.OpenAI(
                base_url=process.url + "/v1", api_key=KEYS["light"], max_retries=0
            )
            for _ in range(3):
                client.completions.create(model="sim", prompt="hi", max_tokens=2)
    finally:
        front.stop()
        server.stop()
    for process in (server, front):
        text = process.log.read_text()
        assert "Uvicorn running on" in text or "startup" in text.lower()  # logs at info
        assert "POST /v1/completions" not in text, text[-1500:]
        unstamped = [line for line in text.splitlines() if not STAMPED.match(line)]
        assert not unstamped, unstamped  # uvicorn's own lines too
    started = re.findall(r"INFO tokenfair\.serve: (tokenfair serve: .*)", server.log.read_text())
    assert started == [
        "tokenfair serve: model sim:fixed:0.01 as 'sim', policy vtc, engine thread, KV pool "
        f"1,000,000 tokens, one open tenant; on http://127.0.0.1:{server.port}; metrics on "
        "the API port"
    ]
