"""One metric vocabulary for the server and the gateway, and one dashboard for both.

A `tokenfair serve --model sim:` server behind a gateway (with Redis, so that the lease
series exist too, and tenants in groups, so that the group series do), real requests
through both, then each process's /metrics read: every shared family has the same name,
type and labels in both; a 4xx is counted as a refusal, never as a success; every query
of docs/grafana-tokenfair.json reads metrics, with the labels it groups by, that the
processes its row is for export; and every family either process exports is shown by
some panel of a row for that process.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.processes import KEYS, Process, gateway, sim_upstream, tenants_file
from tests.gateway.redis_server import RedisServer, free_port
from tokenfair.edge import metric_families
from tokenfair.edge.metric_families import Family

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-tokenfair.json"
SHARED = [f for f in vars(metric_families).values() if isinstance(f, Family)]
COMMANDS = {"server": "tokenfair serve", "gateway": "tokenfair gateway"}  # as rows name them


class Scrape:
    """One /metrics answer: each family's type, and its samples' names and labels."""

    def __init__(self, process: Process) -> None:
        text = httpx.get(process.metrics_url + "/metrics", timeout=10).text
        self.types: dict[str, str] = {}
        self.samples: dict[str, list[dict[str, str]]] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples.setdefault(sample.name, []).append(sample.labels)

    def exports(self, sample: str) -> bool:
        """Whether the sample's family is declared (with samples or not yet)."""
        family = re.sub(r"_(total|bucket|sum|count)$", "", sample)
        return sample in self.samples or family in self.types or sample in self.types

    def value_count(self, name: str, **labels: str) -> int:
        return sum(1 for found in self.samples.get(name, []) if labels.items() <= found.items())


def _grouped_tenants(tmp_path: Path) -> Path:
    """The tests' tenants, light in org-a/search and heavy in org-a: group series."""
    data = yaml.safe_load(tenants_file(tmp_path).read_text())
    data["groups"] = {"org-a": {"weight": 2, "groups": {"search": {"weight": 1}}}}
    for tenant in data["tenants"]:
        if tenant["name"] in ("light", "heavy"):
            tenant["group"] = "org-a/search" if tenant["name"] == "light" else "org-a"
    path = tmp_path / "grouped.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _family(name: str) -> str:
    """A sample's family as the parser names it (no _total, _bucket, _sum, _count)."""
    return re.sub(r"_(total|bucket|sum|count)$", "", name)


def _traffic(server: Process, gw: Process) -> None:
    light = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS["light"], max_retries=0)
    stream = light.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    assert sum(1 for _ in stream) >= 1
    light.completions.create(model="sim", prompt="hello there", max_tokens=3)
    # Refused by the gateway itself: over the tenant's bound of 100 tokens.
    tight = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS["tight"], max_retries=0)
    with pytest.raises(openai.BadRequestError):
        tight.completions.create(model="sim", prompt="x", max_tokens=200)
    # Refused by the upstream (echo is not supported), passed back through the gateway.
    with pytest.raises(openai.BadRequestError):
        light.completions.create(model="sim", prompt="x", max_tokens=2, echo=True)
    # And the same mistake sent to the server directly.
    direct = httpx.post(
        server.url + "/v1/completions",
        json={"model": "sim", "prompt": "x", "max_tokens": 2, "echo": True},
        headers={"Authorization": f"Bearer {KEYS['light']}"},
        timeout=10,
    )
    assert direct.status_code == 400


def _rows(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(title of the row it is in, panel) for every panel."""
    out, row = [], ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        else:
            out.append((row, panel))
    return out


def test_the_server_and_the_gateway_speak_one_vocabulary(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    grouped = _grouped_tenants(tmp_path)
    metrics_port = free_port()
    server = sim_upstream(
        tmp_path, "sim", "--enable-prefix-caching", "--tenants", str(grouped),
        "--metrics-port", str(metrics_port),
    )  # fmt: skip
    server.metrics_port = metrics_port
    gw = gateway(
        tmp_path,
        [{"url": server.url + "/v1", "models": ["sim"], "max_concurrent": 4,
          "api_key": KEYS["other"]}],
        redis={"url": redis_server.url, "namespace": "vocabulary"},
        tenants=str(grouped),
    )  # fmt: skip
    try:
        _traffic(server, gw)
        scrapes = {"server": Scrape(server), "gateway": Scrape(gw)}
    finally:
        gw.stop()
        server.stop()

    # Names, types and labels: the same in both.
    for family in SHARED:
        for role, scrape in scrapes.items():
            kind = "histogram" if family.buckets else scrape.types.get(family.name)
            assert family.name in scrape.types, (role, family.name)
            assert scrape.types[family.name] == kind, (role, family.name)
            name = family.name + ("_total" if kind == "counter" else "")
            name += "_bucket" if kind == "histogram" else ""
            for labels in scrape.samples.get(name, []):
                expected = set(family.labels) | ({"le"} if family.buckets else set())
                assert set(labels) == expected, (role, name, labels)
        kinds = {scrape.types[family.name] for scrape in scrapes.values()}
        assert len(kinds) == 1, (family.name, kinds)

    # No *_created series from either (vLLM exports none; they double the counters).
    for role, scrape in scrapes.items():
        assert not [name for name in scrape.samples if name.endswith("_created")], role

    # A 4xx is a refusal, never a success: light's two answers, its one refusal.
    at_gateway = scrapes["gateway"]
    assert at_gateway.value_count("tokenfair:request_success_total", tenant="light") >= 1
    assert not any(
        labels["finished_reason"].startswith("http_")
        for labels in at_gateway.samples["tokenfair:request_success_total"]
    )
    assert at_gateway.value_count(
        "tokenfair:requests_rejected_total", tenant="light", reason="invalid_value"
    )
    assert at_gateway.value_count(
        "tokenfair:requests_rejected_total", tenant="tight", reason="context_length_exceeded"
    )
    assert scrapes["server"].value_count(
        "tokenfair:requests_rejected_total", tenant="light", reason="invalid_value"
    )
    for scrape in scrapes.values():  # by path, every level of the tree
        groups = {labels["group"] for labels in scrape.samples["tokenfair:group_weight"]}
        assert groups == {"org-a", "org-a/search"}

    # The dashboard: each query reads metrics its row's processes export, and groups by
    # labels those metrics carry.
    dashboard = json.loads(DASHBOARD.read_text())
    variable = dashboard["templating"]["list"][1]["query"]
    for scrape in scrapes.values():
        assert "tokenfair:build_info" in scrape.samples, variable
    checked = 0
    for row, panel in _rows(dashboard):
        roles = [r for r, command in COMMANDS.items() if command in row]
        assert roles, f"row {row!r} names neither the server nor the gateway"
        for target in panel["targets"]:
            expr = target["expr"]
            names = re.findall(r"tokenfair:[a-z0-9_]+", expr)
            grouped = {
                label.strip()
                for group in re.findall(r"by \(([^)]*)\)", expr)
                for label in group.split(",")
            }
            assert names, expr
            for role in roles:
                scrape = scrapes[role]
                for name in names:
                    assert scrape.exports(name), (role, panel["title"], name)
                    if name in scrape.samples:  # a counter nothing has hit yet has none
                        carried = {k for labels in scrape.samples[name] for k in labels}
                        assert grouped <= carried, (role, panel["title"], name, grouped - carried)
                checked += 1
    assert checked >= 20

    # Every family each process exports is on the dashboard: in a panel of a row for
    # that process (the instance list reads build_info).
    shown: dict[str, set[str]] = {role: {"tokenfair:build_info"} for role in COMMANDS}
    for row, panel in _rows(dashboard):
        for role, command in COMMANDS.items():
            if command in row:
                for target in panel["targets"]:
                    shown[role] |= {
                        _family(name)
                        for name in re.findall(r"tokenfair:[a-z0-9_]+", target["expr"])
                    }
    for role, scrape in scrapes.items():
        missing = sorted(name for name in scrape.types if name.startswith("tokenfair:")
                         and name not in shown[role])  # fmt: skip
        assert not missing, (role, "exported but on no panel", missing)
    for family in SHARED:  # the shared ones on the rows both processes have
        assert all(family.name in names for names in shown.values()), family.name
