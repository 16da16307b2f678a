"""Reading the product's YAML: a key given twice in one mapping is refused at its line
(PyYAML would keep the last one silently), and an error in a config file names its line.

Every YAML file tokenfair reads (tenants files, the gateway's config, weights files,
the vLLM plugin's settings file) goes through `load_with_nodes` or `safe_load` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice; `line` is the second one's (1-based)."""

    def __init__(self, key: object, first: yaml.Node, again: yaml.Node) -> None:
        self.key = key
        self.line = again.start_mark.line + 1
        self.first_line = first.start_mark.line + 1
        super().__init__(
            problem=f"the key {key!r} is given twice in one mapping (first at line "
            f"{self.first_line}); give it once",
            problem_mark=again.start_mark,
        )


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping giving one key twice (DuplicateKeyError).
    Keys merged in with `<<: *anchor` may still be overridden: that is what they are for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the constructor refuses it itself
                if first is not key_node:
                    raise DuplicateKeyError(key, first, key_node)
        return super().construct_mapping(node, deep=deep)


def load_with_nodes(text: str) -> tuple[Any, yaml.Node | None]:
    """The document (as `yaml.safe_load` gives it, duplicate keys refused) and its node
    tree, from one parse; yaml.YAMLError as safe_load raises it (DuplicateKeyError for a
    key given twice)."""
    loader = UniqueKeyLoader(text)
    try:
        root = loader.get_single_node()
        return (loader.construct_document(root) if root is not None else None), root
    finally:
        loader.dispose()


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, with duplicate keys refused."""
    return load_with_nodes(text)[0]


def yaml_error(error: yaml.YAMLError, source: str) -> str:
    """One line for a YAML file that cannot be read: `source:LINE: what is wrong`."""
    if isinstance(error, DuplicateKeyError):
        return f"{source}:{error.line}: {error.problem}"
    mark = getattr(error, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = getattr(error, "problem", None) or error
    return f"{where}: not valid YAML: {problem}"


def validation_message(first: Mapping[str, Any]) -> str:
    """The message of pydantic's first error as config errors give it: without the
    "Value error, " prefix, and a boolean where a number goes said as such (true is
    not 1 in a config file)."""
    if isinstance(first.get("input"), bool) and first.get("type") in ("float_type", "int_type"):
        return f"expected a number, got the boolean {str(first['input']).lower()}"
    return str(first["msg"]).removeprefix("Value error, ")


def line_of(root: yaml.Node | None, path: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the node at `path` (keys and list indexes), as far down as
    the YAML goes; None for an empty document."""
    node, line = root, None
    for part in path:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            node = node.value[part] if part < len(node.value) else None
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line
