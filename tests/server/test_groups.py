"""Groups of tenants through `tokenfair serve`: shares by group, per-group metrics, the
admin API on groups, and a reload that keeps the tree's shape."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.server.conftest import ADMIN_KEY, Server, launch
from tokenfair.edge.tenants import hash_key

KEYS = {"a1": "key-a1", "a2": "key-a2", "b1": "key-b1"}


def grouped_tenants() -> dict[str, object]:
    return {
        "admin_key_sha256": hash_key(ADMIN_KEY),
        "groups": {"org-a": {"weight": 2, "groups": {"search": {}}}, "org-b": {}},
        "tenants": [
            {"name": "a1", "group": "org-a/search", "key_sha256": hash_key(KEYS["a1"])},
            {"name": "a2", "group": "org-a/search", "key_sha256": hash_key(KEYS["a2"])},
            {"name": "b1", "group": "org-b", "key_sha256": hash_key(KEYS["b1"])},
        ],
    }


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("grouped"),
        "--model", "sim:fixed:0.002", "--max-num-seqs", "2",
        tenants=grouped_tenants(),
    )  # fmt: skip
    yield server
    server.stop()


ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def group_series(server: Server, name: str) -> dict[str, float]:
    return {
        dict(labels)["group"]: value
        for (sample, labels), value in server.metrics().items()
        if sample == name
    }


def test_each_group_has_its_counter_weight_and_service_in_metrics(grouped: Server) -> None:
    body = {"model": "sim:fixed:0.002", "prompt": "hello there", "max_tokens": 4}
    for key in KEYS.values():
        answer = httpx.post(
            f"{grouped.url}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 200
    weights = group_series(grouped, "tokenfair:group_weight")
    assert weights["org-a"] == 2.0 and weights["org-a/search"] == 1.0 and weights["org-b"] == 1
    service = group_series(grouped, "tokenfair:group_service_total")
    # Three tokens of prompt and four generated (w_out = 2) per request.
    assert service["org-a"] == service["org-a/search"] == 2 * service["org-b"] > 0
    counters = group_series(grouped, "tokenfair:group_vtc_counter")
    assert counters["org-a"] > 0 and counters["org-b"] > 0


def test_the_admin_api_lists_groups_and_changes_any_group_s_weight(grouped: Server) -> None:
    rows = httpx.get(f"{grouped.url}/admin/groups", headers=ADMIN).json()["data"]
    assert [r["path"] for r in rows] == ["org-a", "org-a/search", "org-b"]
    assert rows[1]["parent"] == "org-a"
    changed = httpx.post(
        f"{grouped.url}/admin/groups/org-a/search/weight", json={"weight": 3}, headers=ADMIN
    )
    assert changed.status_code == 200
    assert group_series(grouped, "tokenfair:group_weight")["org-a/search"] == 3.0
    missing = httpx.post(
        f"{grouped.url}/admin/groups/org-z/weight", json={"weight": 3}, headers=ADMIN
    )
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "path"
    tenants = httpx.get(f"{grouped.url}/admin/tenants", headers=ADMIN).json()["data"]
    assert {r["name"]: r["group"] for r in tenants}["b1"] == "org-b"


def test_a_reload_that_moves_a_tenant_is_refused_and_the_tree_stays(grouped: Server) -> None:
    path = Path(next(a for a in grouped.process.args if str(a).endswith(".yaml")))  # type: ignore[union-attr]
    before = path.read_text()
    data = grouped_tenants()
    data["tenants"][2]["group"] = "org-a/search"  # type: ignore[index]
    path.write_text(yaml.safe_dump(data))
    try:
        answer = httpx.post(f"{grouped.url}/admin/reload", headers=ADMIN)
        assert answer.status_code == 400
        assert "'b1' moves from '@org-b' to '@org-a/search'" in answer.json()["error"]["message"]
    finally:
        path.write_text(before)
    assert httpx.post(f"{grouped.url}/admin/reload", headers=ADMIN).status_code == 200


def test_backlogged_groups_share_the_server_by_weight(tmp_path: Path) -> None:
    """Org a (weight 2, two keys) and org b (one key), all backlogged: a gets 2/3."""
    server = launch(
        tmp_path, "--model", "sim:fixed:0.002", "--max-num-seqs", "1", tenants=grouped_tenants()
    )
    stop = threading.Event()

    def closed_loop(key: str) -> None:
        body = {"model": "sim:fixed:0.002", "prompt": "x" * 32, "max_tokens": 8}
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                client.post(
                    f"{server.url}/v1/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                )

    loops = [threading.Thread(target=closed_loop, args=(k,)) for k in KEYS.values() for _ in "123"]
    try:
        for loop in loops:
            loop.start()
        deadline = time.monotonic() + 60
        while group_series(server, "tokenfair:group_service_total").get("org-b", 0) < 500:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        start = group_series(server, "tokenfair:group_service_total")
        while (
            group_series(server, "tokenfair:group_service_total")["org-b"] < start["org-b"] + 2000
        ):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        end = group_series(server, "tokenfair:group_service_total")
    finally:
        stop.set()
        for loop in loops:
            loop.join()
        server.stop()
    ratio = (end["org-a"] - start["org-a"]) / (end["org-b"] - start["org-b"])
    assert ratio == pytest.approx(2.0, rel=0.1)
