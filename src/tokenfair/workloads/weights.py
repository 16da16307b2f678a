"""Client weights files, for weighted and hierarchical VTC.

Either flat, a JSON object {client: weight} (weights from 0.01 to 100, core/weights.py),
or a tree of groups (JSON, or YAML with PyYAML installed) in the tenants file's
`groups:` format (docs/fairness.md):

    {"groups": {"org-a": {"weight": 2, "groups": {"search": {}}}, "org-b": {}},
     "clients": {"heavy": {"group": "org-a/search"}, "b1": {"group": "org-b", "weight": 2}}}

A client that the file does not name weighs 1 at the top level. A key given twice in
one object (JSON or YAML) is refused at its line, as a weight that is not a number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenfair.core.share_tree import ShareTree, ShareTreeError
from tokenfair.core.weights import check_weight
from tokenfair.share_groups import (
    GROUP_NAME_RULE,
    MAX_GROUP_DEPTH,
    Group,
    GroupName,
    Weight,
    group_weights,
    share_tree,
    too_deep,
)


class WeightsError(ValueError):
    """A weights file that cannot be used; the message names the file and the client."""


class ClientShare(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    group: str | None = Field(default=None, min_length=1)
    weight: Weight = 1.0


class SharesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    groups: dict[GroupName, Group] = Field(default_factory=dict)
    clients: dict[str, ClientShare] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClientShares:
    """Every node's weight (clients by name, groups as `@path`) and the tree."""

    weights: dict[str, float] = field(default_factory=dict)
    tree: ShareTree = field(default_factory=ShareTree)

    def client_weights(self) -> dict[str, float]:
        return {n: w for n, w in self.weights.items() if not n.startswith("@")}


def _load(path: Path) -> tuple[Any, Any]:
    """The document and, where PyYAML can give it, its node tree (for line numbers)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise WeightsError(f"cannot read weights file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise WeightsError(f"weights file {path}: not UTF-8 text") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys), _nodes(path, text)
    except _DuplicateKey as error:
        _nodes(path, text)  # raises naming the line, when PyYAML can give it
        raise WeightsError(
            f"weights file {path}: the key {error.key!r} is given twice in one object; give it once"
        ) from None
    except json.JSONDecodeError as error:
        if path.suffix not in (".yaml", ".yml"):
            raise WeightsError(
                f"weights file {path}:{error.lineno}: not JSON: {error.msg}"
            ) from None
    try:
        import yaml

        from tokenfair.yaml_lines import load_with_nodes, yaml_error
    except ImportError:
        raise WeightsError(f"weights file {path}: YAML needs PyYAML (pip install pyyaml)") from None
    try:
        return load_with_nodes(text)
    except yaml.YAMLError as error:
        raise WeightsError(yaml_error(error, f"weights file {path}")) from None


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads keeps the last of a key given twice; a weights file may not."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(key)
        found[key] = value
    return found


def _nodes(path: Path, text: str) -> Any:
    """The YAML node tree of a JSON file (JSON is YAML), for line numbers."""
    try:
        from tokenfair.yaml_lines import DuplicateKeyError, load_with_nodes
    except ImportError:  # no PyYAML: no lines
        return None
    try:
        return load_with_nodes(text)[1]
    except DuplicateKeyError as error:  # the line JSON's own parser cannot give
        raise WeightsError(f"weights file {path}:{error.line}: {error.problem}") from None
    except Exception:  # JSON that PyYAML reads differently: no lines
        return None


def _where(path: Path, root: Any, loc: tuple) -> str:
    line = None
    if root is not None:
        from tokenfair.yaml_lines import line_of

        line = line_of(root, loc)
    return f"weights file {path}:{line}" if line else f"weights file {path}"


def read_shares(path: str | Path) -> ClientShares:
    path = Path(path)
    data, root = _load(path)
    if not isinstance(data, dict):
        raise WeightsError(f"weights file {path}: expected a JSON object mapping client to weight")
    if not ("groups" in data and "clients" in data and isinstance(data["clients"], dict)):
        return ClientShares(_flat(path, data, root))
    try:
        parsed = SharesFile.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        loc = tuple(first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        if isinstance(first.get("input"), bool) and first["type"] in ("float_type", "int_type"):
            message = f"expected a number, got the boolean {str(first['input']).lower()}"
        if loc and loc[-1] == "[key]":
            loc, message = loc[:-1], GROUP_NAME_RULE
        elif first["type"] == "extra_forbidden":
            message = "unknown key"
        key = ".".join(str(p) for p in loc)
        raise WeightsError(f"{_where(path, root, loc)}: {key}: {message}") from None
    deep = too_deep(parsed.groups, ("groups",))
    if deep is not None:
        raise WeightsError(
            f"{_where(path, root, deep)}: {'.'.join(deep)}: groups nest at most "
            f"{MAX_GROUP_DEPTH} deep"
        )
    members = {c: s.group for c, s in parsed.clients.items() if s.group is not None}
    try:
        tree = share_tree(parsed.groups, members)
    except ShareTreeError as error:
        client = next((c for c in members if repr(c) in str(error)), None)
        loc = ("clients", client, "group") if client is not None else ("clients",)
        raise WeightsError(f"{_where(path, root, loc)}: {'.'.join(loc)}: {error}") from None
    weights = group_weights(parsed.groups)
    weights.update({c: s.weight for c, s in parsed.clients.items()})
    return ClientShares(weights, tree)


def _flat(path: Path, data: dict[str, Any], root: Any) -> dict[str, float]:
    weights = {}
    for client, weight in data.items():
        try:
            weights[str(client)] = check_weight(weight, f"weight of {client!r}")
        except ValueError as error:
            raise WeightsError(f"{_where(path, root, (client,))}: {error}") from None
    return weights


def read_weights(path: str | Path) -> dict[str, float]:
    """The clients' weights of a weights file, flat or a tree (without the groups)."""
    return read_shares(path).client_weights()
