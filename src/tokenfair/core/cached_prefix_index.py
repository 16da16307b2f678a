"""`CachedPrefixIndex`: how a locality-aware policy follows its waiting requests'
cached prefixes through a `PrefixCache` (core/prefix_cache.py).

`CachedPrefixIndex` keeps, for every waiting request a policy tracks, how many leading
blocks of it are cached, without walking every waiting request at every step (and
tells the cache which blocks those requests want, so it evicts them last). It keeps
them in groups: the requests of one queue, priority and band whose cached prefix is the
same chain of blocks (a client's requests behind one system prompt, or on one
document). A group is checked, moved in its queue and counted in the cache's wanted
blocks as one, so a prefix evicted or cached again costs per group, however many
requests wait on it:
- growth is pushed: a group waits on the one hash that would extend its match (its
  next block; where its requests' chains part, each part on its own); when that block
  is cached, the index extends the match (parting the requests that go on from the
  rest) and tells the policy, which re-files the group;
- shrinkage is pulled: every block of a tracked match is wanted, so only the eviction
  of a wanted block can shorten one, and `verify` checks a group again when wanted
  blocks were evicted since its last check. A policy ordering by the estimate
  verifies its choice before taking it; since estimates never understate, the first
  choice that verifies is the true longest. Groups that come to claim the same prefix
  merge.

A check looks only at the blocks evicted since the last one, when the cache names them
(`wanted_evicted_since`): the match now ends at the first of them in it that is still
not cached, and every block before that one is cached as it was. Without the names
(vLLM's cache) the group is walked again from its first block.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenfair.core.prefix_cache import PrefixCache

if TYPE_CHECKING:  # the policies package imports this module
    from tokenfair.core.policies.view import RequestView


class _Member:
    __slots__ = ("group", "hashes", "order", "request")

    def __init__(self, request: RequestView, hashes: list[int], order: int) -> None:
        self.request = request
        self.hashes = hashes  # its matchable blocks' chain hashes
        self.order = order  # its place in line (its queue's)
        self.group: PrefixGroup


class PrefixGroup:
    """Waiting requests of one queue and one (priority, band) that claim the same cached
    prefix: the same chain of `blocks` leading blocks, checked and changed together."""

    __slots__ = (
        "band",
        "blocks",
        "chain",
        "common",
        "filed",
        "key",
        "members",
        "nexts",
        "owner",
        "place",
        "priority",
        "rep",
        "waits",
        "walked_at",
    )

    def __init__(self, owner: object, priority: int, band: int, rep: _Member) -> None:
        self.owner = owner  # the queue the members wait in
        self.priority = priority
        self.band = band
        self.rep = rep  # a member, whose hashes stand for the group's
        self.chain = rep.hashes
        self.blocks = 0  # cached leading blocks claimed (never an understatement)
        # A length the members' chains share at least (>= blocks): below it they all
        # wait on the same next block; at it, each on its own.
        self.common = len(rep.hashes)
        self.members: list[tuple[int, _Member]] = []  # by place in line
        # The members' blocks at `common` (where their chains part): hash -> how many.
        self.nexts: dict[int, int] = {}
        self.walked_at = -1  # the cache's wanted evictions at the last check
        self.waits: set[int] = set()  # the hashes it waits on, none of them cached
        self.place: dict[int, int] | None = None  # hash -> first place in `chain`
        self.key: tuple | None = None  # its key in the index; None once dissolved
        self.filed: Any = None  # the queue's live entry for it (the queue's own field)

    def requests(self) -> list[RequestView]:
        return [member.request for _, member in self.members]


def _common_length(a: list[int], b: list[int], start: int, limit: int) -> int:
    """The first place in [start, limit) where chains `a` and `b` differ, else limit (or
    the shorter one's end), by halving with slice comparisons (they run in C)."""
    limit = min(limit, len(a), len(b))
    if a is b or a[start:limit] == b[start:limit]:
        return max(start, limit)
    low, high = start, limit  # a[start:low] == b[start:low]; a[low:high] != b[low:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


class CachedPrefixIndex:
    """The cached-prefix length of each tracked request, kept by group (see module doc).

    `on_grow(group)` is told of every group whose cached prefix grew (its members may
    be others than before: groups merge and part)."""

    def __init__(self, on_grow: Callable[[PrefixGroup], None]) -> None:
        self._on_grow = on_grow
        self._cache: PrefixCache | None = None
        self._members: dict[str, _Member] = {}  # request id -> its entry
        self._groups: dict[tuple, PrefixGroup] = {}  # key -> the group of that claim
        # hash -> the groups some of whose members' match that block would extend
        self._waiting_on: dict[int, dict[int, PrefixGroup]] = {}

    def attach(self, cache: PrefixCache) -> None:
        if cache.enable_prefix_caching:
            self._cache = cache
            cache.on_cached.append(self._blocks_cached)

    @property
    def wanted_evictions(self) -> int:
        """The cache's count of evicted wanted blocks (0 without a cache)."""
        return self._cache.wanted_evictions if self._cache is not None else 0

    # --- members ---
    def track(
        self, request: RequestView, owner: object = None, band: int = 1, order: int = 0
    ) -> PrefixGroup:
        """Follow a waiting request of queue `owner` (`band` and `order`: the queue's
        own terms, its place in line among its equals); the group it joins."""
        cache = self._cache
        if cache is None:
            hashes: list[int] = []
            blocks = 0
        else:
            hashes = cache.block_hashes(request, cache.matchable_blocks(request))
            blocks = cache.cached_run(request, hashes, 0)
        member = self._members[request.request_id] = _Member(request, hashes, order)
        key = (id(owner), request.priority, band, blocks, hashes[blocks - 1] if blocks else None)
        group = self._groups.get(key)
        if group is None:
            group = member.group = PrefixGroup(owner, request.priority, band, member)
            group.members.append((order, member))  # `common` is its chain's end: no nexts
            group.walked_at = self.wanted_evictions
            group.key = key
            group.blocks = blocks
            self._groups[key] = group
            if cache is not None:
                cache.want(hashes[:blocks])
                self._advance(group)
            return group
        member.group = group
        members = group.members
        if order > members[-1][0]:
            members.append((order, member))  # the usual case: a new arrival
        else:
            bisect.insort(members, (order, member))
        common = _common_length(group.chain, hashes, blocks, group.common)
        if common < group.common:
            group.common = common
            self._count_nexts(group)
        elif len(hashes) > common:
            next_key = hashes[common]
            group.nexts[next_key] = group.nexts.get(next_key, 0) + 1
        if blocks < len(hashes):  # not cached (the walk stopped there)
            self._wait(group, hashes[blocks])
        return group

    def untrack(self, request: RequestView) -> PrefixGroup | None:
        """Stop following the request; the group it left, unless that dissolved."""
        member = self._members.pop(request.request_id, None)
        if member is None:
            return None
        group = member.group
        members = group.members
        if members[0][1] is member:
            del members[0]  # the usual case: the head leaves
        else:
            del members[bisect.bisect_left(members, (member.order,))]
        if not members:
            self._dissolve(group)
            return None
        hashes, common = member.hashes, group.common
        if len(hashes) > common:
            key = hashes[common]
            count = group.nexts[key] - 1
            if count:
                group.nexts[key] = count
            else:  # nobody left to wait on it
                del group.nexts[key]
                self._unwait(group, key)
        if group.rep is member:
            group.rep = members[0][1]
            group.chain = group.rep.hashes  # the same up to `common`
        return group

    def group_of(self, request: RequestView) -> PrefixGroup | None:
        member = self._members.get(request.request_id)
        return None if member is None else member.group

    def blocks(self, request: RequestView) -> int:
        """The request's cached leading blocks, as last seen (never an understatement)."""
        member = self._members.get(request.request_id)
        return 0 if member is None else member.group.blocks

    # --- shrinkage, pulled ---
    def verify(self, group: PrefixGroup) -> PrefixGroup | None:
        """Check the group's match again if wanted blocks were evicted since its last
        check: None if it stands, else the group now holding its members (shorter,
        perhaps merged with another)."""
        cache = self._cache
        if cache is None:
            return None
        evictions = cache.wanted_evictions
        if group.walked_at == evictions:
            return None
        before = group.blocks
        evicted = cache.wanted_evicted_since(group.walked_at)
        group.walked_at = evictions
        if before == 0:
            return None
        first = before
        if evicted is None or len(evicted) >= before:
            first = 0  # as cheap as looking at the evictions, or unknown
        else:
            place = group.place
            if place is None or len(place) < before:
                chain = group.chain[: group.common]
                # The first place of a hash wins, as in a walk.
                place = group.place = dict(
                    zip(reversed(chain), range(len(chain) - 1, -1, -1), strict=True)
                )
            # Blocks of the match not evicted since the last check are cached still:
            # the match holds up to the first of those evicted, and is walked from there.
            for key in evicted:
                at = place.get(key, before)
                if at < first:
                    first = at
            if first == before:
                return None
        blocks = min(cache.cached_run(group.rep.request, group.chain, first), before)
        if blocks == before:
            return None
        group = self._claim(group, blocks)
        # Shorter now: each member waits on the block that was evicted (or on one
        # already waited on), so nothing grows here.
        self._advance(group)
        return group

    # --- growth, pushed ---
    def _blocks_cached(self, keys: list[int]) -> None:
        waiting_on = self._waiting_on
        for key in keys:
            waiting = waiting_on.pop(key, None)
            if not waiting:
                continue
            for group in list(waiting.values()):
                group.waits.discard(key)
                if group.key is None:
                    continue  # dissolved meanwhile
                blocks = group.blocks
                if blocks < group.common:
                    if group.chain[blocks] != key:
                        continue  # it waits elsewhere now
                else:
                    if key not in group.nexts:
                        continue  # its member left
                    parting = [
                        entry
                        for entry in group.members
                        if len(entry[1].hashes) > blocks and entry[1].hashes[blocks] == key
                    ]
                    if not parting:
                        continue
                    if len(parting) < len(group.members):
                        group = self._part(group, parting)
                for grown in self._advance(group):
                    if grown.key is not None:
                        self._on_grow(grown)

    def _advance(self, group: PrefixGroup) -> list[PrefixGroup]:
        """Extend the group's match over what is cached, parting members whose chains
        go separate ways into groups of their own, and make each wait on the block that
        would extend it; the groups whose match grew."""
        cache = self._cache
        assert cache is not None
        grown: list[PrefixGroup] = []
        pending = [group]
        while pending:
            group = pending.pop()
            while True:
                blocks = group.blocks
                if blocks < group.common:
                    extended = min(
                        cache.cached_run(group.rep.request, group.chain, blocks), group.common
                    )
                    if extended > blocks:
                        group = self._claim(group, extended)
                        grown.append(group)
                        continue
                    self._wait(group, group.chain[blocks])
                    break
                # The members' chains part here (or end): each waits on its own next block.
                nexts = group.nexts
                if len(nexts) == 1 and next(iter(nexts.values())) == len(group.members):
                    # They go on together: `common` was an understatement.
                    chain = group.chain
                    group.common = min(
                        _common_length(chain, entry[1].hashes, blocks, len(chain))
                        for entry in group.members
                    )
                    self._count_nexts(group)
                    continue
                unknown = nexts.keys() - group.waits  # those waited on are not cached
                parts: dict[int, list[tuple[int, _Member]]] = {}
                if unknown:
                    for entry in group.members:
                        hashes = entry[1].hashes
                        if len(hashes) > blocks and hashes[blocks] in unknown:
                            parts.setdefault(hashes[blocks], []).append(entry)
                for key, part in parts.items():
                    member = part[0][1]
                    if cache.cached_run(member.request, member.hashes, blocks) == blocks:
                        self._wait(group, key)
                    elif len(part) == len(group.members):
                        pending.append(group)  # the last of them: they go on together
                    else:
                        pending.append(self._part(group, part))
                break
        return list(dict.fromkeys(grown))

    # --- groups ---
    def _wait(self, group: PrefixGroup, key: int) -> None:
        """The group waits on block `key` (not cached now)."""
        if key not in group.waits:
            group.waits.add(key)
            self._waiting_on.setdefault(key, {})[id(group)] = group

    def _unwait(self, group: PrefixGroup, key: int) -> None:
        if key in group.waits:
            group.waits.discard(key)
            waiting = self._waiting_on[key]
            del waiting[id(group)]
            if not waiting:
                del self._waiting_on[key]

    @staticmethod
    def _count_nexts(group: PrefixGroup) -> None:
        common, nexts = group.common, dict[int, int]()
        for _, member in group.members:
            hashes = member.hashes
            if len(hashes) > common:
                key = hashes[common]
                nexts[key] = nexts.get(key, 0) + 1
        group.nexts = nexts

    def _claim(self, group: PrefixGroup, blocks: int) -> PrefixGroup:
        """The group's match is `blocks` long now: tell the cache what it wants; the
        group holding its members after (another, when their claims now match)."""
        cache = self._cache
        assert cache is not None
        before = group.blocks
        if blocks > before:
            cache.want(group.chain[before:blocks])
        elif blocks < before:
            cache.unwant(group.chain[blocks:before])
        if self._groups.get(group.key) is group:  # type: ignore[arg-type]
            del self._groups[group.key]  # type: ignore[arg-type]
        group.blocks = blocks
        claim = group.chain[blocks - 1] if blocks else None
        key = (id(group.owner), group.priority, group.band, blocks, claim)
        group.key = key
        other = self._groups.get(key)
        if other is None:
            self._groups[key] = group
            return group
        return self._merge(other, group)

    def _merge(self, a: PrefixGroup, b: PrefixGroup) -> PrefixGroup:
        """Two groups of one queue claiming the same prefix: the smaller joins the other."""
        cache = self._cache
        assert cache is not None
        kept, gone = (a, b) if len(a.members) >= len(b.members) else (b, a)
        blocks = kept.blocks
        common = _common_length(kept.chain, gone.chain, blocks, min(kept.common, gone.common))
        kept.walked_at = min(kept.walked_at, gone.walked_at)
        for _, member in gone.members:
            member.group = kept
        kept.members = sorted(kept.members + gone.members)
        if common == kept.common == gone.common:
            nexts = kept.nexts
            for key, count in gone.nexts.items():
                nexts[key] = nexts.get(key, 0) + count
        else:
            kept.common = common
            self._count_nexts(kept)
        waiting_on = self._waiting_on
        for key in gone.waits:  # still not cached: the merged group waits on them
            waiting = waiting_on.get(key)
            if waiting is not None:
                waiting.pop(id(gone), None)
                waiting[id(kept)] = kept
                kept.waits.add(key)
        gone.waits = set()
        cache.unwant(gone.chain[:blocks])  # one claim of the two
        gone.members = []
        gone.key = gone.filed = None
        self._groups[kept.key] = kept  # type: ignore[index]
        return kept

    def _part(self, group: PrefixGroup, part: list[tuple[int, _Member]]) -> PrefixGroup:
        """Move `part` (some of the group's members, in order) into a group of their own,
        claiming the same prefix for now (the caller extends it at once)."""
        cache = self._cache
        assert cache is not None
        leaving = {id(entry[1]) for entry in part}
        group.members = [entry for entry in group.members if id(entry[1]) not in leaving]
        if id(group.rep) in leaving:
            group.rep = group.members[0][1]
            group.chain = group.rep.hashes
        new = PrefixGroup(group.owner, group.priority, group.band, part[0][1])
        new.members = part
        new.blocks = group.blocks
        new.walked_at = group.walked_at
        new.key = group.key  # not entered in the index until its claim moves on
        chain = new.chain
        new.common = min(
            _common_length(chain, entry[1].hashes, new.blocks, len(chain)) for entry in part
        )
        for _, member in part:
            member.group = new
        self._count_nexts(new)
        self._count_nexts(group)
        cache.want(chain[: new.blocks])
        return new

    def _dissolve(self, group: PrefixGroup) -> None:
        waiting_on = self._waiting_on
        for key in group.waits:
            waiting = waiting_on.get(key)
            if waiting is not None:
                waiting.pop(id(group), None)
                if not waiting:
                    del waiting_on[key]
        group.waits = set()
        if self._cache is not None:
            self._cache.unwant(group.chain[: group.blocks])
        if self._groups.get(group.key) is group:  # type: ignore[arg-type]
            del self._groups[group.key]  # type: ignore[arg-type]
        group.key = group.filed = None
