"""A request's prompt prefix as the gateway sees it, and what each upstream has been sent.

The gateway does not tokenize to route: it cuts the prompt's text (chat messages
rendered as role and text, or the prompt string, or token ids written out) into
fixed-size blocks of bytes and chains their hashes, each block's hash covering every
block before it, as an engine's prefix cache chains its KV blocks. Tokenization is
prefix-stable in practice, so text blocks match where token blocks would.

The chain starts from the tenant and the model: an engine that isolates tenants' prefix
caches (tokenfair salts them by tenant, vLLM by `cache_salt`) never serves one tenant's
cached prefix to another, so a match across tenants would promise a hit that cannot
happen.

Chain hashes use Python's own hash (SipHash; several times faster than hashlib here)
and so differ between processes: each gateway replica keeps its own index, which is
all it needs (see routing.py). The first block's `home` key, which replicas must agree
on, is hashed with blake2b, once per request and only when the index has no match.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tokenfair.gateway.messages import text_of

_MASK = (1 << 64) - 1


@dataclass(slots=True)
class PrefixKey:
    """What routing needs of one request's prompt."""

    chain: list[int]  # the chained hash after each full block, first block first
    seed: bytes  # tenant and model: where the chain starts
    first: bytes  # the first block (or the whole prompt, when shorter than a block)

    def home(self) -> int:
        """A 64-bit key every replica computes alike: tenant, model and first block."""
        digest = hashlib.blake2b(self.seed + self.first, digest_size=8).digest()
        return int.from_bytes(digest, "little")


def _render(kind: str, payload: Any) -> bytes:
    """The prompt as bytes whose prefixes follow the prompt's: a longer conversation or
    prompt renders to an extension of the shorter one's bytes."""
    if kind == "chat":
        parts = []
        for message in payload:
            if isinstance(message, dict):
                parts.append(f"{message.get('role')}\x00{text_of(message.get('content'))}\x1e")
        return "".join(parts).encode("utf-8", "surrogatepass")
    if isinstance(payload, str):
        return payload.encode("utf-8", "surrogatepass")
    if isinstance(payload, list):
        if all(isinstance(t, int) for t in payload):
            return "".join(f"{t}," for t in payload).encode()
        return b"\x1e".join(_render(kind, p) for p in payload)
    return b""


def prefix_key(
    tenant: str, model: str, kind: str, payload: Any, block_bytes: int, max_blocks: int
) -> PrefixKey | None:
    """The key of a completion's prompt (`kind` "chat" or "completions"); None for a
    prompt with no text to route by."""
    data = _render(kind, payload)
    if not data:
        return None
    seed = f"{tenant}\x00{model}\x00".encode("utf-8", "surrogatepass")
    blocks = min(len(data) // block_bytes, max_blocks)
    chain = []
    parent = hash(seed)
    for start in range(0, blocks * block_bytes, block_bytes):
        parent = hash((parent, data[start : start + block_bytes]))
        chain.append(parent)
    return PrefixKey(chain, seed, data[:block_bytes])


def mix64(value: int) -> int:
    """SplitMix64's finaliser: spreads a 64-bit value's bits (rendezvous scores)."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)


def name_key(name: str) -> int:
    """An upstream's 64-bit rendezvous salt, the same in every replica."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


class PrefixIndex:
    """The chained block hashes sent to one upstream: an LRU of at most `capacity`.

    Recording touches a chain deepest block first, so a block is never older than the
    blocks after it in its chain; the LRU therefore evicts chains from their tails,
    what is left of a chain is always a prefix of it, and the longest match is a binary
    search (an approximation, like the index itself: an engine evicts by its own rules).
    """

    __slots__ = ("_blocks", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, chain: list[int]) -> int:
        """How many leading blocks of `chain` this upstream was sent."""
        blocks = self._blocks
        lo, hi = 0, len(chain)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def record(self, chain: list[int]) -> None:
        blocks = self._blocks
        for block in reversed(chain):
            blocks[block] = None
            blocks.move_to_end(block)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
