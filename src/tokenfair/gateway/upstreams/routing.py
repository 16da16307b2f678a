"""Where an admitted request goes: the least-loaded upstream, or the one holding its prefix.

Routing decides only *where*: the admission policy (VTC) has already decided *who* goes
next, and a router is asked only when some upstream has room, which it always returns
(work conservation: no request waits for a preferred upstream while another has room).

`least-loaded`: the upstream with room whose fill (the higher of its request and token
fractions) is lowest.

`prefix-affinity` (in the spirit of consistent hashing with bounded loads, and of
D²LPM's dispatcher in "Locality-aware Fair Scheduling in LLM Serving", Cao et al.
2025): the upstreams with room whose fill is within `overload_bound` of the least
loaded one's are *within the bound*. Of those, the request goes to the one this
gateway has sent the longest matching prefix to (ties: the less full). When none holds
any of it, it goes to its *home*: the first upstream within the bound in the rendezvous
(highest-random-weight) order of its tenant, model and first block, an order every
gateway replica computes alike from upstream names alone, so that replicas place a new
prefix on the same upstream without talking to each other. A request passed over by
the upstream holding its longest prefix, or by its home, is an overload diversion.

Every decision is counted by upstream and reason, and so are the prompt blocks routed
and the blocks the index expected each upstream to hold: their ratio estimates the
prefix hit rate routing achieves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from tokenfair.gateway.upstreams.prefix import PrefixIndex, PrefixKey, mix64, name_key, prefix_key

if TYPE_CHECKING:
    from tokenfair.gateway.config import RoutingConfig


class Routable(Protocol):
    """What routing needs of an upstream (the pool's `Upstream` is one)."""

    @property
    def name(self) -> str: ...

    def fullness(self) -> float:
        """How full it is, 0 (idle) to 1 (at capacity) or more."""
        ...


Upstream = TypeVar("Upstream", bound=Routable)

AFFINITY = "affinity"
FIRST_PLACEMENT = "first_placement"
OVERLOAD_DIVERSION = "overload_diversion"
LEAST_LOADED = "least_loaded"
REASONS = (AFFINITY, FIRST_PLACEMENT, OVERLOAD_DIVERSION, LEAST_LOADED)


@dataclass(slots=True)
class UpstreamRouting:
    """One upstream's routing figures (read by /metrics)."""

    decisions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    blocks: int = 0  # prompt blocks of the requests routed here
    matched: int = 0  # of those, blocks the index expected it to hold


class Router(Protocol):
    mode: str
    stats: dict[str, UpstreamRouting]

    def key(self, tenant: str, model: str, kind: str, payload: object) -> PrefixKey | None:
        """What the router needs of a request, computed once before it waits."""
        ...

    def route(
        self, serving: Sequence[Upstream], candidates: Sequence[Upstream], key: PrefixKey | None
    ) -> Upstream:
        """One of `candidates` (the upstreams with room, never empty) for the request;
        `serving` are all the healthy upstreams of its model, room or not."""
        ...

    def forget(self, upstream: Routable) -> None:
        """The upstream left rotation: whatever it cached may be gone."""
        ...


def _least_loaded(candidates: Sequence[Upstream]) -> Upstream:
    best = candidates[0]
    best_fill = best.fullness()
    for upstream in candidates[1:]:
        fill = upstream.fullness()
        if fill < best_fill:
            best, best_fill = upstream, fill
    return best


class LeastLoadedRouter:
    mode = "least-loaded"

    def __init__(self) -> None:
        self.stats: dict[str, UpstreamRouting] = {}

    def key(self, tenant: str, model: str, kind: str, payload: object) -> PrefixKey | None:
        return None

    def route(
        self, serving: Sequence[Upstream], candidates: Sequence[Upstream], key: PrefixKey | None
    ) -> Upstream:
        chosen = _least_loaded(candidates)
        stats = self.stats.get(chosen.name)
        if stats is None:
            stats = self.stats[chosen.name] = UpstreamRouting()
        stats.decisions[LEAST_LOADED] += 1
        return chosen

    def forget(self, upstream: Routable) -> None:
        return None


class PrefixAffinityRouter:
    mode = "prefix-affinity"

    def __init__(self, config: RoutingConfig) -> None:
        self.block_bytes = config.block_bytes
        self.max_blocks = config.max_blocks
        self.index_blocks = config.index_blocks
        self.overload_bound = config.overload_bound
        self.stats: dict[str, UpstreamRouting] = {}
        self._index: dict[str, PrefixIndex] = {}
        self._salt: dict[str, int] = {}

    def key(self, tenant: str, model: str, kind: str, payload: object) -> PrefixKey | None:
        return prefix_key(tenant, model, kind, payload, self.block_bytes, self.max_blocks)

    def index(self, name: str) -> PrefixIndex:
        index = self._index.get(name)
        if index is None:
            index = self._index[name] = PrefixIndex(self.index_blocks)
        return index

    def _rendezvous(self, serving: Sequence[Upstream], key: PrefixKey) -> list[Upstream]:
        """`serving` in the key's rendezvous order, the same in every replica."""
        home = key.home()
        salts = self._salt
        for upstream in serving:
            if upstream.name not in salts:
                salts[upstream.name] = name_key(upstream.name)
        return sorted(serving, key=lambda u: mix64(home ^ salts[u.name]), reverse=True)

    def route(
        self, serving: Sequence[Upstream], candidates: Sequence[Upstream], key: PrefixKey | None
    ) -> Upstream:
        if key is None:  # nothing to route by
            chosen, reason, matched = _least_loaded(candidates), LEAST_LOADED, 0
        else:
            chosen, reason, matched = self._choose(serving, candidates, key)
            self.index(chosen.name).record(key.chain)
        stats = self.stats.get(chosen.name)
        if stats is None:
            stats = self.stats[chosen.name] = UpstreamRouting()
        stats.decisions[reason] += 1
        if key is not None:
            stats.blocks += len(key.chain)
            stats.matched += matched
        return chosen

    def _choose(
        self, serving: Sequence[Upstream], candidates: Sequence[Upstream], key: PrefixKey
    ) -> tuple[Upstream, str, int]:
        limit = min(u.fullness() for u in candidates) + self.overload_bound
        within = [u for u in candidates if u.fullness() <= limit]  # never empty
        longest = 0
        if key.chain:
            matches = {u.name: self.index(u.name).match(key.chain) for u in serving}
            longest = max(matches.values(), default=0)
        if longest:
            # The longest prefix among those within the bound; ties go to the less full.
            chosen = min(within, key=lambda u: (-matches[u.name], u.fullness()))
            matched = matches[chosen.name]
            return chosen, AFFINITY if matched == longest else OVERLOAD_DIVERSION, matched
        order = self._rendezvous(serving, key)
        chosen = next(u for u in order if u in within)
        return chosen, FIRST_PLACEMENT if chosen is order[0] else OVERLOAD_DIVERSION, 0

    def forget(self, upstream: Routable) -> None:
        index = self._index.get(upstream.name)
        if index is not None:
            index.clear()


def make_router(config: RoutingConfig) -> Router:
    if config.mode == "least-loaded":
        return LeastLoadedRouter()
    return PrefixAffinityRouter(config)
