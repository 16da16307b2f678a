"""Which client a converted request belongs to: an explicit, stable rule.

Public traces rarely say who the tenant was, so the converter is told how to decide:

- `ClientMap.column(name)`: the value of a column (field) is the client name;
- `ClientMap.hashed(name, n)`: the value of a column is hashed (BLAKE2b, stable across
  runs and machines, unlike Python's hash()) into one of n clients `client-0` ..
  `client-<n-1>`;
- `ClientMap.constant(name)`: every request belongs to one client.

A column name may index into a list value, e.g. `hash_ids[0]` (Mooncake's first prefix
block: requests sharing a system prompt land on the same client). Non-string values are
rendered as compact JSON before naming or hashing.

`parse_client_map("column:Model" | "hash:Model:8" | "const:default")` reads the CLI form.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_INDEXED = re.compile(r"^(?P<name>.+)\[(?P<index>-?\d+)\]$")


class ClientMapError(ValueError):
    """The mapping cannot name a client for this row (missing column, bad index...)."""


@dataclass(frozen=True, slots=True)
class ClientMap:
    kind: str  # "column", "hash" or "constant"
    value: str  # the column name, or the constant client name
    buckets: int = 0  # number of clients for "hash"

    def __post_init__(self) -> None:
        if self.kind not in ("column", "hash", "constant"):
            raise ValueError(f"client map kind must be column, hash or constant, not {self.kind!r}")
        if not self.value:
            raise ValueError("client map needs a column name or client name")
        if self.kind == "hash" and self.buckets < 1:
            raise ValueError(f"hash client map needs >= 1 clients, got {self.buckets}")

    @classmethod
    def column(cls, name: str) -> ClientMap:
        return cls("column", name)

    @classmethod
    def hashed(cls, name: str, buckets: int) -> ClientMap:
        return cls("hash", name, buckets)

    @classmethod
    def constant(cls, client: str) -> ClientMap:
        return cls("constant", client)

    def client_for(self, row: Mapping[str, Any]) -> str:
        """The client of one row (a CSV dict row or a JSON object)."""
        if self.kind == "constant":
            return self.value
        text = _render(_lookup(row, self.value))
        if self.kind == "column":
            if not text:
                raise ClientMapError(f"client column {self.value!r} is empty")
            return text
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
        return f"client-{int.from_bytes(digest, 'big') % self.buckets}"

    def describe(self) -> str:
        if self.kind == "hash":
            return f"hash:{self.value}:{self.buckets}"
        return f"{'const' if self.kind == 'constant' else 'column'}:{self.value}"


def _lookup(row: Mapping[str, Any], column: str) -> Any:
    if column in row:
        return row[column]
    match = _INDEXED.match(column)
    if match and match["name"] in row:
        value = row[match["name"]]
        if not isinstance(value, list):
            raise ClientMapError(f"column {match['name']!r} is not a list, cannot index it")
        index = int(match["index"])
        if not -len(value) <= index < len(value):
            raise ClientMapError(f"column {column!r}: index out of range (length {len(value)})")
        return value[index]
    raise ClientMapError(f"missing client column {column!r}")


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def parse_client_map(text: str) -> ClientMap:
    """Parse `column:NAME`, `hash:NAME:N` or `const:NAME` (the CLI's --client option)."""
    kind, _, rest = text.partition(":")
    if kind == "column" and rest:
        return ClientMap.column(rest)
    if kind in ("const", "constant") and rest:
        return ClientMap.constant(rest)
    if kind == "hash":
        name, _, buckets = rest.rpartition(":")
        if name and buckets.isdigit() and int(buckets) >= 1:
            return ClientMap.hashed(name, int(buckets))
    raise ValueError(
        f"bad client mapping {text!r}: use column:NAME, hash:NAME:N (N >= 1) or const:NAME"
    )
