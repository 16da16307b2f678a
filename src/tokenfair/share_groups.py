"""The group tree as people write it: the `groups:` of a tenants file (server, gateway)
and of a simulator weights file, validated by pydantic.

    groups:
      org-a:
        weight: 2                 # among its siblings; 1 by default
        groups:
          search: {weight: 1}     # its path is org-a/search
      org-b: {}

A tenant (or a trace's client) names its group by path; without one it sits at the
top level. The core's `ShareTree` is what the scheduler uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from tokenfair.core.share_tree import ShareTree, group_id
from tokenfair.core.weights import weight_problem

# A group's own name (its path joins the names with '/').
GroupName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*$")
]


def _weight(value: object) -> object:
    problem = weight_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# A node's weight (core/weights.py: a number from 0.01 to 100, never a boolean): the
# one type of every weight read from a file or the admin API.
Weight = Annotated[float, BeforeValidator(_weight)]
MAX_GROUP_DEPTH = 8
GROUP_NAME_RULE = "a group's name is letters, digits and . _ : @ + - (a path joins names with '/')"


class Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    weight: Weight = 1.0
    groups: dict[GroupName, Group] = Field(default_factory=dict)


def group_paths(groups: dict[str, Group]) -> dict[str, tuple[str | None, float]]:
    """Every group's path -> (its parent's path or None, its weight)."""
    found: dict[str, tuple[str | None, float]] = {}

    def walk(level: dict[str, Group], parent: str | None) -> None:
        for name, group in level.items():
            path = name if parent is None else f"{parent}/{name}"
            found[path] = (parent, group.weight)
            walk(group.groups, path)

    walk(groups, None)
    return found


def too_deep(groups: dict[str, Group], at: tuple[int | str, ...]) -> tuple | None:
    """The key path of the first group nested deeper than MAX_GROUP_DEPTH, or None."""

    def walk(level: dict[str, Group], where: tuple) -> Iterator[tuple]:
        for name, group in level.items():
            yield (*where, name)
            yield from walk(group.groups, (*where, name, "groups"))

    for loc in walk(groups, at):
        if len(loc) - len(at) >= 2 * MAX_GROUP_DEPTH:
            return loc
    return None


def share_tree(groups: dict[str, Group], members: dict[str, str]) -> ShareTree:
    """The core's tree: `members` maps a client to its group's path."""
    parents = {path: parent for path, (parent, _) in group_paths(groups).items()}
    return ShareTree.build(parents, members)


def group_weights(groups: dict[str, Group]) -> dict[str, float]:
    """Every group's weight by node id (`@path`)."""
    return {group_id(path): weight for path, (_, weight) in group_paths(groups).items()}
