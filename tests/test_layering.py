"""The package's dependencies point one way, read from the source's import statements.

core <- engine <- experiments <- report, with the fairness metrics (pure functions of
per-request results) beside the engine: core/ and engine/ import nothing from the
measurement side; only report/ draws with matplotlib; no import cycle; no module over
600 lines unless listed, with its reason, as long by design.

The serving side: core <- edge <- (server, gateway), core <- engine <- server, and
core <- integrations/vllm (which reads the edge's tenants file format, and nothing else
of the edge). The server and the gateway share their tenant edge (tenants
file, limits, errors, body reading, metric families) and never import each other.
Inside the gateway, each room (transport, flow, upstreams, replicas) imports of the
others only what its docstring says, and only the fairness seam charges the counters.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "tokenfair"
MEASUREMENT = ("tokenfair.fairness", "tokenfair.experiments", "tokenfair.report")
# A module past this many lines is read again for a second idea to move out; one that
# holds a single idea is listed in LONG_BY_DESIGN with its reason. The bound is a
# prompt to look, not a target: no module is split to meet it.
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Modules a file imports (absolute names), at any depth or at module level only."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("layer", ["tokenfair.core", "tokenfair.engine"])
def test_core_and_engine_import_nothing_from_the_measurement_side(layer: str) -> None:
    offenders = {
        (name, imported)
        for name, path in MODULES.items()
        if under(name, layer)
        for imported in imports(path)
        if any(under(imported, m) for m in MEASUREMENT)
    }
    assert not offenders


def test_core_is_standard_library_only() -> None:
    allowed = set(sys.stdlib_module_names)
    for name, path in MODULES.items():
        if under(name, "tokenfair.core"):
            for imported in imports(path):
                root = imported.split(".")[0]
                assert root in allowed or under(imported, "tokenfair.core"), (name, imported)


def test_measurement_layers_point_one_way() -> None:
    # fairness <- experiments <- report: a lower layer never imports a higher one.
    forbidden = {
        "tokenfair.fairness": ("tokenfair.experiments", "tokenfair.report", "matplotlib"),
        "tokenfair.experiments": ("tokenfair.report", "matplotlib"),
    }
    for name, path in MODULES.items():
        for layer, banned in forbidden.items():
            if under(name, layer):
                hits = [i for i in imports(path) if any(under(i, b) for b in banned)]
                assert not hits, (name, hits)


def test_only_report_uses_matplotlib() -> None:
    users = {
        name for name, path in MODULES.items() if any(under(i, "matplotlib") for i in imports(path))
    }
    assert users and all(under(name, "tokenfair.report") for name in users)


def test_measurement_side_imports_only_at_module_level() -> None:
    """A function-level import of a tokenfair module would hide a cycle."""
    for name, path in MODULES.items():
        if any(under(name, m) for m in MEASUREMENT):
            inner = {i for i in imports(path) if i.startswith("tokenfair")}
            top = {i for i in imports(path, top_level_only=True) if i.startswith("tokenfair")}
            assert inner == top, (name, inner - top)


def test_no_import_cycle_between_modules() -> None:
    """Every import counts: at module level, inside a function, and for type checking
    only (a cycle there is still two ideas that cannot be read one without the other)."""
    graph = {
        name: {i for i in imports(path) if i in MODULES and i != name}
        for name, path in MODULES.items()
    }
    # A package's __init__ importing its own modules is not a cycle between ideas.
    for name in graph:
        graph[name] = {i for i in graph[name] if not under(i, name)}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [])


# Modules allowed over MAX_LINES while being split (none now).
LONG_MODULES_BEING_SPLIT: dict[str, int] = {}
# Modules long by design, with the bound they keep and why (none now; the scheduler,
# at about 520 lines, is one step of the algorithm top to bottom, running, swapped,
# waiting and the admission loop applying the contention decisions, and is the only
# code that changes `running`).
LONG_BY_DESIGN: dict[str, int] = {}


def test_no_module_over_600_lines_unless_long_by_design() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    allowed = {**LONG_MODULES_BEING_SPLIT, **LONG_BY_DESIGN}
    long = {name: n for name, n in lengths.items() if n > allowed.get(name, MAX_LINES)}
    assert not long


SERVING_ARROWS = {
    # package: what it may import from tokenfair besides itself
    "tokenfair.edge": ("tokenfair.core", "tokenfair.share_groups", "tokenfair.yaml_lines"),
    "tokenfair.gateway": ("tokenfair.core", "tokenfair.edge", "tokenfair.yaml_lines"),
    "tokenfair.server": ("tokenfair.core", "tokenfair.edge", "tokenfair.engine"),
    # and the tenants file's format, so that vLLM reads the gateway's file
    "tokenfair.integrations": (
        "tokenfair.core",
        "tokenfair.share_groups",
        "tokenfair.yaml_lines",
        "tokenfair.edge.tenants",
    ),
}


@pytest.mark.parametrize("package", sorted(SERVING_ARROWS))
def test_serving_packages_import_only_below_them(package: str) -> None:
    allowed = (package, *SERVING_ARROWS[package])
    offenders = {
        (name, imported)
        for name, path in MODULES.items()
        if under(name, package)
        for imported in imports(path)
        if imported.startswith("tokenfair.") and not any(under(imported, a) for a in allowed)
    }
    assert not offenders


def test_the_server_and_the_gateway_never_import_each_other() -> None:
    for name, path in MODULES.items():
        for mine, theirs in (("server", "gateway"), ("gateway", "server")):
            if under(name, f"tokenfair.{mine}"):
                assert not any(under(i, f"tokenfair.{theirs}") for i in imports(path)), name


GATEWAY = "tokenfair.gateway"
# The gateway's rooms, lowest first: each imports only rooms before it, never one after.
GATEWAY_ROOM_ORDER = ("upstreams", "replicas", "flow", "transport")
# Each room, and what it may import of the rest of the gateway (its package docstring
# says the same): modules of the rooms below it, or of the top level.
GATEWAY_ROOMS: dict[str, tuple[str, ...]] = {
    "upstreams": ("config", "messages"),
    "replicas": ("upstreams.pool", "upstreams.capacity"),
    "flow": ("messages", "upstreams.pool", "upstreams.prefix", "replicas.counters"),
    "transport": (
        "config",
        "metrics",
        "flow.admission",
        "flow.fairness",
        "flow.meter",
        "flow.ticket",
        "flow.tokens",
        "upstreams.client",
        "upstreams.kinds",
        "upstreams.pool",
    ),
}


def test_gateway_rooms_import_one_way() -> None:
    """No room may import a room above it: the rooms are layers, not a web."""
    assert set(GATEWAY_ROOM_ORDER) == set(GATEWAY_ROOMS)
    for place, room in enumerate(GATEWAY_ROOM_ORDER):
        for allowed in GATEWAY_ROOMS[room]:
            other = allowed.partition(".")[0]
            if other in GATEWAY_ROOMS:
                assert GATEWAY_ROOM_ORDER.index(other) < place, (room, allowed)


@pytest.mark.parametrize("room", sorted(GATEWAY_ROOMS))
def test_gateway_rooms_import_of_each_other_only_what_they_say(room: str) -> None:
    package = f"{GATEWAY}.{room}"
    assert imports(MODULES[package]) == set(), "a room's __init__ imports nothing"
    allowed = (package, *(f"{GATEWAY}.{name}" for name in GATEWAY_ROOMS[room]))
    offenders = {
        (name, imported)
        for name, path in MODULES.items()
        if under(name, package)
        for imported in imports(path)
        if under(imported, GATEWAY)
        and imported != GATEWAY
        and not any(under(imported, a) for a in allowed)
    }
    assert not offenders


def test_only_the_fairness_seam_charges_the_counters() -> None:
    """The meter, the proxy and the rest of the request's path charge a tenant through
    flow/fairness.py: none of them imports the counter stores."""
    door = f"{GATEWAY}.flow.fairness"
    offenders = {
        (name, imported)
        for name, path in MODULES.items()
        if any(under(name, f"{GATEWAY}.{room}") for room in ("flow", "transport")) and name != door
        for imported in imports(path)
        if under(imported, f"{GATEWAY}.replicas")
    }
    assert not offenders
