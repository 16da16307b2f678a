"""The server and the gateway at their edge: the same answers to the same mistakes,
/metrics kept from tenants, removed tenants gone from it, slow clients cut off.

One `tokenfair serve --model sim:` server (a tenants file with an admin key, a metrics
port) and one gateway in front of it (a tenants file without one, a metrics port), both
with a read timeout of 1 s and a body timeout of 3 s.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.processes import KEYS, Process, gateway, metrics, sim_upstream, tenants_file
from tests.gateway.redis_server import free_port
from tokenfair.edge.defaults import DEFAULT_MAX_BODY_BYTES
from tokenfair.edge.tenants import hash_key

pytestmark = pytest.mark.slow
ADMIN = "admin-key"
SUCCESS = "tokenfair:request_success_total"


def _key(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("edge")
    server_tenants = tmp / "server-tenants.yaml"
    data = yaml.safe_load(tenants_file(tmp).read_text())
    data["admin_key_sha256"] = hash_key(ADMIN)
    server_tenants.write_text(yaml.safe_dump(data))
    metrics_port = free_port()
    server = sim_upstream(
        tmp, "server", "--tenants", str(server_tenants), "--metrics-port", str(metrics_port),
        "--read-timeout", "1", "--body-timeout", "3", profile="fixed:0.002",
    )  # fmt: skip
    server.metrics_port = metrics_port
    upstream = {"url": server.url + "/v1", "models": ["sim"], "max_concurrent": 8}
    gw = gateway(tmp, [{**upstream, "api_key": KEYS["other"]}], read_timeout_s=1, body_timeout_s=3)
    try:
        yield {"server": server, "gateway": gw, "tmp": tmp, "server_tenants": server_tenants}
    finally:
        gw.stop()
        server.stop()


def _answer(response: httpx.Response) -> tuple[int, Any, Any]:
    error = response.json().get("error", {})
    return response.status_code, error.get("code"), error.get("param")


def test_the_same_mistakes_get_the_same_answers(edge: dict[str, Any]) -> None:
    server, gw = edge["server"], edge["gateway"]
    completions = "/v1/completions"
    cases: list[tuple[str, str, dict[str, Any], tuple[int, Any, Any]]] = [
        ("GET", completions, {}, (405, "method_not_allowed", None)),
        ("OPTIONS", completions, {}, (405, "method_not_allowed", None)),
        ("OPTIONS", "/v1/chat/completions", {}, (405, "method_not_allowed", None)),
        ("POST", completions, {"content": b"{not json"}, (400, "invalid_json", None)),
        ("POST", completions, {"json": "a string"}, (400, "invalid_value", None)),
        ("POST", completions, {"json": {"model": 12, "prompt": "x"}}, (400, "invalid_value", "model")),
        ("POST", completions, {"json": {"model": "nope", "prompt": "x"}}, (404, "model_not_found", "model")),
        ("POST", completions, {"content": b"x" * (DEFAULT_MAX_BODY_BYTES + 1)}, (413, "body_too_large", None)),
        ("GET", "/v1/models/nope", {}, (404, "model_not_found", "model")),
        ("GET", "/v1/nothing", {}, (404, "not_found", None)),
    ]  # fmt: skip
    for method, path, body, expected in cases:
        for process in (server, gw):
            response = httpx.request(
                method, process.url + path, headers=_key("light"), timeout=30, **body
            )
            assert _answer(response) == expected, (process.args[-1], method, path, response.text)
            if expected[0] == 405:  # what is allowed there: POST, on both
                assert response.headers["allow"] == "POST", (process.args[-1], method, path)
    wrong_type = httpx.post(
        gw.url + completions, json={"model": 12, "prompt": "x"}, headers=_key("light"), timeout=10
    ).json()
    assert "missing" not in wrong_type["error"]["message"]
    # /v1/models: behind a tenant's key on both, and the served model by its id.
    for process in (server, gw):
        assert httpx.get(process.url + "/v1/models", timeout=10).status_code == 401
        listed = httpx.get(process.url + "/v1/models", headers=_key("light"), timeout=10).json()
        assert [m["id"] for m in listed["data"]] == ["sim"]
        one = httpx.get(process.url + "/v1/models/sim", headers=_key("light"), timeout=10)
        assert one.status_code == 200 and one.json()["id"] == "sim"


def test_metrics_are_the_operators(edge: dict[str, Any]) -> None:
    server, gw = edge["server"], edge["gateway"]
    admin = {"Authorization": f"Bearer {ADMIN}"}
    # The server's file has an admin key: on the API port, /metrics is the admin's alone.
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
    assert httpx.get(server.url + "/metrics", headers=_key("light"), timeout=10).status_code == 403
    assert httpx.get(server.url + "/metrics", headers=admin, timeout=10).status_code == 200
    # The gateway's has none: its operator pages are not served on the API port at all.
    for page in ("/metrics", "/v1/gateway/state", "/v1/gateway/requests/recent"):
        refused = httpx.get(gw.url + page, headers=_key("light"), timeout=10)
        assert _answer(refused)[:2] == (404, "operator_only"), page
        assert "metrics port" in refused.json()["error"]["message"]
        assert httpx.get(gw.metrics_url + page, timeout=10).status_code == 200, page
    # The metrics ports serve the operator's pages without a key, and nothing else.
    assert "tokenfair:build_info" in httpx.get(server.metrics_url + "/metrics", timeout=10).text
    for process in (server, gw):
        assert httpx.get(process.metrics_url + "/health", timeout=10).status_code == 200
        elsewhere = httpx.post(process.metrics_url + "/v1/completions", json={}, timeout=10)
        assert _answer(elsewhere)[:2] == (404, "not_found")
    # /health answers anyone with its status alone; the gateway names its upstreams to
    # the operator only.
    for headers in ({}, _key("light")):
        assert httpx.get(gw.url + "/health", headers=headers, timeout=10).json() == {"status": "ok"}
    operator_view = httpx.get(gw.metrics_url + "/health", timeout=10).json()
    assert operator_view == {"status": "ok", "upstreams": ["upstream-0"]}


def test_api_docs_are_off_by_default(edge: dict[str, Any]) -> None:
    for process in (edge["server"], edge["gateway"]):
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            for headers in ({}, _key("light")):
                answer = httpx.get(process.url + path, headers=headers, timeout=10)
                assert _answer(answer)[:2] == (404, "not_found"), (process.args[-1], path)


def _delta(
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    after: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    **labels: str,
) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_the_same_traffic_counts_the_same_on_both(edge: dict[str, Any]) -> None:
    """Requests through the gateway, which sends them all to the server as its own
    tenant: a request of n=3 choices (streamed and not) and plain ones count as the
    same requests and the same prompt tokens (each prompt once, as usage reports it)
    at both ends; the server's choice families count the engine's requests."""
    server, gw = edge["server"], edge["gateway"]
    as_sent = "other"  # the gateway's upstream api_key is this tenant's key
    before = {server: metrics(server), gw: metrics(gw)}
    bodies = [
        ("/v1/completions", {"prompt": "three choices of this", "n": 3, "max_tokens": 3}),
        ("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "three streamed choices"}],
            "n": 3, "max_tokens": 2, "stream": True,
        }),
        ("/v1/completions", {"prompt": "one plain prompt", "max_tokens": 4}),
        ("/v1/completions", {"prompt": "and another, streamed", "max_tokens": 2, "stream": True}),
    ]  # fmt: skip
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    for path, body in bodies:
        with httpx.stream(
            "POST", gw.url + path, json={"model": "sim", **body}, headers=_key("light"),
            timeout=30,
        ) as answer:  # fmt: skip
            assert answer.status_code == 200
            text = answer.read().decode()
        if body.get("stream"):
            assert text.rstrip().endswith("data: [DONE]")
        else:
            for key in usage:
                usage[key] += json.loads(text)["usage"][key]
    deadline = time.monotonic() + 30  # the gateway counts a request as it lets it go
    while True:
        after = {server: metrics(server), gw: metrics(gw)}
        ended = _delta(before[gw], after[gw], SUCCESS, tenant="light", finished_reason="length")
        if ended >= len(bodies) or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    def both(name: str, **labels: str) -> tuple[float, float]:
        at_server = _delta(before[server], after[server], name, tenant=as_sent, **labels)
        return at_server, _delta(before[gw], after[gw], name, tenant="light", **labels)

    assert both(SUCCESS, finished_reason="length") == (len(bodies), len(bodies))
    prompt_tokens = both("tokenfair:prompt_tokens_total")
    assert prompt_tokens[0] == prompt_tokens[1] > 0
    generated = both("tokenfair:generation_tokens_total")
    assert generated == (3 * 3 + 3 * 2 + 4 + 2,) * 2
    assert both("tokenfair:e2e_request_latency_seconds_count") == (len(bodies), len(bodies))
    # Per choice, the server's own families: what its engine ran.
    per_choice = _delta(before[server], after[server], "tokenfair:choice_prompt_tokens_total",
                        tenant=as_sent)  # fmt: skip
    assert per_choice > prompt_tokens[0]  # the n=3 requests' prompts, once per choice
    choices = _delta(before[server], after[server], "tokenfair:choice_success_total",
                     tenant=as_sent, finished_reason="length")  # fmt: skip
    assert choices == 3 + 3 + 1 + 1
    assert usage["completion_tokens"] == 3 * 3 + 4


def _closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset
            return True
    return False


def test_slow_clients_are_cut_off(edge: dict[str, Any]) -> None:
    """Half-sent headers, and a body announced but not sent: the connection is closed
    after the read timeout (1 s here), and the process goes on serving."""
    for process in (edge["server"], edge["gateway"]):
        slow: list[socket.socket] = []
        for i in range(30):
            sock = socket.create_connection(("127.0.0.1", process.port))
            if i % 3 == 0:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            elif i % 3 == 1:
                sock.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    b'application/json\r\nContent-Length: 1000\r\n\r\n{"model": '
                )
            slow.append(sock)  # and the third kind sends nothing at all
        deadline = time.monotonic() + 60  # a bound for a busy machine, not a speed
        assert all(_closed_by_peer(sock, deadline) for sock in slow)
        for sock in slow:
            sock.close()
        ok = httpx.post(
            process.url + "/v1/completions",
            json={"model": "sim", "prompt": "x", "max_tokens": 2},
            headers=_key("light"),
            timeout=30,
        )
        assert ok.status_code == 200


def test_a_body_trickled_in_is_cut_off_at_its_deadline(edge: dict[str, Any]) -> None:
    """A body sent a byte every 0.2 s never pauses as long as the read timeout (1 s),
    but it must be in whole within the body timeout (3 s) of the headers' end: past it
    the connection is closed, on the server and on the gateway alike."""
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEYS["light"].encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    )
    for process in (edge["server"], edge["gateway"]):
        sock = socket.create_connection(("127.0.0.1", process.port))
        sock.settimeout(0.2)
        sock.sendall(head)
        start = time.monotonic()
        closed = False
        while not closed and time.monotonic() - start < 30:  # a bound, not a speed
            try:
                sock.sendall(b" ")
                closed = sock.recv(4096) == b""
            except TimeoutError:
                continue
            except OSError:  # reset, or a broken pipe
                closed = True
        took = time.monotonic() - start
        sock.close()
        assert closed, (process.args[-1], "still reading after 30 s")
        assert took >= 2.5, (process.args[-1], took)  # not before the deadline


def _tenants_in(process: Process, headers: dict[str, str] | None = None) -> set[str]:
    text = httpx.get(process.metrics_url + "/metrics", headers=headers, timeout=10).text
    return {
        line.split('tenant="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("tokenfair:prompt_tokens_total{")
    }


def test_a_removed_tenant_leaves_metrics_on_reload(edge: dict[str, Any]) -> None:
    server, gw, tmp = edge["server"], edge["gateway"], edge["tmp"]
    for process in (server, gw):
        sent = httpx.post(
            process.url + "/v1/completions",
            json={"model": "sim", "prompt": "x", "max_tokens": 1},
            headers=_key("limited"),
            timeout=30,
        )
        assert sent.status_code == 200
        assert "limited" in _tenants_in(process)
    files = {server: edge["server_tenants"], gw: tmp / "tenants.yaml"}
    kept = {}
    for process, path in files.items():
        kept[process] = path.read_text()
        data = yaml.safe_load(kept[process])
        data["tenants"] = [t for t in data["tenants"] if t["name"] != "limited"]
        path.write_text(yaml.safe_dump(data))
        assert process.popen is not None
        process.popen.send_signal(signal.SIGHUP)
    try:
        deadline = time.monotonic() + 60
        for process in (server, gw):
            while "limited" in _tenants_in(process):
                assert time.monotonic() < deadline, "the removed tenant's series stayed"
                time.sleep(0.1)
            assert "light" in _tenants_in(process)  # the others stay
    finally:
        for process, path in files.items():
            path.write_text(kept[process])
            assert process.popen is not None
            process.popen.send_signal(signal.SIGHUP)


def test_fields_pass_through_the_gateway_unchanged(edge: dict[str, Any], tmp_path: Path) -> None:
    """What the gateway does not schedule by reaches the upstream as the client sent it;
    the default engine (`vllm`) adds only the tenant's cache salt and `vllm_xargs`."""
    from tests.gateway.processes import fake_upstream, stats

    upstream = fake_upstream(tmp_path, "echo")
    gw = gateway(tmp_path, [{"url": upstream.url, "models": ["fake"], "max_concurrent": 2}])
    body = {
        "model": "fake",
        "prompt": ["first", "second"],
        "n": 3,
        "max_tokens": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "top_k": -1,
        "logit_bias": {"50256": -100},
        "response_format": {"type": "json_object"},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "echo": True,
        "seed": 7,
        "vendor_extension": {"anything": [1, 2, 3]},
    }
    try:
        answer = httpx.post(
            gw.url + "/v1/completions", json=body, headers=_key("light"), timeout=30
        )
        assert answer.status_code == 200
        sent = stats(upstream)["last_body"]
        assert {key: sent[key] for key in body} == body
        assert set(sent) - set(body) == {"cache_salt", "vllm_xargs"}
        assert sent["vllm_xargs"] == {"tenant": "light"}
    finally:
        gw.stop()
        upstream.stop()
