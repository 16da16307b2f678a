"""Where a key of a YAML document is: so that an error in a config file names its line."""

from __future__ import annotations

from typing import Any

import yaml


def load_with_nodes(text: str) -> tuple[Any, yaml.Node | None]:
    """The document (as `yaml.safe_load` gives it) and its node tree, from one parse;
    yaml.YAMLError as safe_load raises it."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        return (loader.construct_document(root) if root is not None else None), root
    finally:
        loader.dispose()


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
