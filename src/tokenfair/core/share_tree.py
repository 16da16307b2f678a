"""Hierarchical shares: clients grouped into a tree (organisation -> team -> key).

A node is a group or a client. Groups are named by their path from the top
(`org-a/search`) and carry the id `@org-a/search` wherever groups and clients share one
namespace (counters, weights): `@` cannot start a client name in a tenants file. A
client that belongs to no group sits at the top level, beside the top-level groups; a
tree with no group is the flat case, where every client is a child of the root.

Weights are kept apart from the tree (a mapping node id -> weight, 1 when absent), so
that an operator can change any node's weight at run time without rebuilding it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GROUP_PREFIX = "@"
ROOT = ""


def group_id(path: str) -> str:
    """The node id of the group at `path` (`org-a/search` -> `@org-a/search`)."""
    return GROUP_PREFIX + path


def is_group(node: str) -> bool:
    return node.startswith(GROUP_PREFIX)


class ShareTreeError(ValueError):
    """A tree that cannot be used: a group's parent that does not exist, a cycle."""


@dataclass(frozen=True, slots=True)
class ShareTree:
    """Who is whose parent: node id -> the parent's node id (ROOT for the top level)."""

    parent: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, groups: Mapping[str, str | None], members: Mapping[str, str]) -> ShareTree:
        """`groups`: group path -> its parent group's path (None: top level);
        `members`: client -> the path of its group."""
        parent: dict[str, str] = {}
        for path, above in groups.items():
            if above is not None and above not in groups:
                raise ShareTreeError(f"group {path!r}: its parent group {above!r} does not exist")
            parent[group_id(path)] = ROOT if above is None else group_id(above)
        for client, path in members.items():
            if is_group(client):
                raise ShareTreeError(f"client {client!r}: a client name cannot start with '@'")
            if path not in groups:
                raise ShareTreeError(f"client {client!r}: its group {path!r} does not exist")
            parent[client] = group_id(path)
        tree = cls(parent)
        for node in parent:
            tree.path(node)  # raises on a cycle
        return tree

    @property
    def flat(self) -> bool:
        return not self.parent

    def parent_of(self, node: str) -> str:
        return self.parent.get(node, ROOT)

    def path(self, node: str) -> tuple[str, ...]:
        """The nodes from the top level down to `node` itself."""
        nodes = [node]
        above = self.parent.get(node, ROOT)
        while above != ROOT:
            if above in nodes or len(nodes) > len(self.parent) + 1:
                raise ShareTreeError(f"group {above!r} is its own ancestor")
            nodes.append(above)
            above = self.parent.get(above, ROOT)
        nodes.reverse()
        return tuple(nodes)

    def groups(self) -> list[str]:
        return [node for node in self.parent if is_group(node)]

    def children(self, node: str) -> list[str]:
        return [child for child, above in self.parent.items() if above == node]


def node_weight(weights: Mapping[str, float], node: str) -> float:
    return weights.get(node, 1.0)


def tree_change(old: ShareTree, new: ShareTree) -> str | None:
    """What makes `new` unusable in place of `old` while running (a reloaded tenants
    file may add tenants and groups and change weights, not move anyone), or None."""
    if old.flat != new.flat:
        return "the file adds groups to a flat tenants file, or removes them all"
    for node, parent in new.parent.items():
        before = old.parent.get(node)
        if before is not None and before != parent:
            return f"{node!r} moves from {before!r} to {parent!r}"
    return None
