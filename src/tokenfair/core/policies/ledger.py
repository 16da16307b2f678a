"""VTC's rules, written once: counters per node of the share tree, the lift, the
charges, and the pick among clients that wait.

The Virtual Token Counter (Sheng et al., OSDI 2024) keeps, for every client, a counter
of the weighted service it has received. With groups (core/share_tree.py) every node,
group or client, has one: a service of s charges s / w_n to each node n on the client's
path, from its top-level group down to the client, w_n being the node's weight among
its siblings. A tree with no group is the flat case, one level under the root.

- **The pick** descends the tree: from the root, the backlogged child (one with a
  waiting request below it) with the smallest counter, down to a client. Each level
  keeps a heap of its backlogged children, one live entry each, ordered by (counter,
  tie rank, filing order); counters mostly grow, so a stale entry (its counter grew) is
  filed again when it reaches the top, and a counter that shrinks (a refund) files a
  fresh entry. A pick is O(depth x log(children)).
- **The lift**: when a client's first waiting request arrives, each node on its path
  that had nothing waiting below it is lifted, top down, to the smallest counter among
  its backlogged siblings, or, with none, to the counter of the sibling admitted last
  (`paper`); the paper artifact's rule skips the second case (`artifact`), `none` never
  lifts (least counter first). So idle time cannot be banked as credit.
- **Charges**: the prompt at the first admission (cached tokens at their share,
  core/cost.py), each output token as reported (the paper's router: the first free).
- **Rebasing**: a float64 counter far larger than a charge no longer registers it, so
  each level keeps its children's counters less a base of its own: an admission that
  finds the level's reference (the least counter of its backlogged children and the
  admitted one) past REBASE_AT moves them all down by it, none below -REBASE_AT (where
  a newcomer starts once the base passes it). Only siblings are compared, so no pick
  changes, bar a node more than REBASE_AT behind: it keeps that much of its credit.
  `counter(s)` add the base back.

Every counter policy, the vLLM plugin and the gateway's replicas keep theirs here.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import Literal

from tokenfair.core.cost import LinearCost, prompt_cost
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.view import RequestView
from tokenfair.core.share_tree import ROOT, ShareTree, is_group

LiftRule = Literal["paper", "artifact", "none"]
LIFT_RULES: tuple[LiftRule, ...] = ("paper", "artifact", "none")
# (node, amount) pairs from the top-level group down to the client, each amount
# already divided by that node's weight: what one service costs each node.
Charge = tuple[tuple[str, float], ...]
# Counters then stay below about 2^31, where float64 resolves 2^-22: a charge of 0.01 (a
# token at the largest weight, core/weights.py) registers to within 0.003%.
REBASE_AT = float(2**30)


def weighted_charge(weighted_path: Sequence[tuple[str, float]], service: float) -> Charge:
    """`service` as each node of a path of (node, weight) pairs pays it: divided by the
    node's weight (what a driver that charges whole paths at once sends, the gateway)."""
    if len(weighted_path) == 1:  # no groups: the usual case, on every streamed chunk
        node, weight = weighted_path[0]
        return ((node, service / weight),)
    return tuple((node, service / weight) for node, weight in weighted_path)


def chargeable_output(num_output_tokens: int, first_token_free: bool) -> int:
    """Of `num_output_tokens` generated, how many are charged (the first may be free:
    `RequestView.first_token_free`)."""
    return max(0, num_output_tokens - 1) if first_token_free else num_output_tokens


class _Level:
    """One group's (or the root's) backlogged children: a heap by counter with one
    live entry per child, and the child admitted last (the lift's reference)."""

    __slots__ = ("heap", "last", "live")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, str]] = []  # (counter, tie rank, seq, node)
        self.live: dict[str, int] = {}  # child -> seq of its one valid entry
        self.last: str | None = None


class CounterLedger:
    """Counters, backlog and charges of VTC over a share tree (see the module doc).

    `ties_to_first_seen`: equal counters go to the node seen first (the paper
    artifact keeps its counters in a dict in first-arrival order); otherwise to the
    node whose entry is oldest, the one already waiting.
    """

    def __init__(
        self,
        settings: PolicySettings | None = None,
        *,
        lift: LiftRule = "paper",
        ties_to_first_seen: bool = False,
    ) -> None:
        if lift not in LIFT_RULES:
            raise ValueError(f"unknown lift rule {lift!r}: expected paper, artifact or none")
        settings = settings or PolicySettings()
        # Shared with whoever configured it: an operator's change is seen at once.
        self.weights = settings.weights
        self.cost = settings.cost
        self.charge_cached_tokens = settings.charge_cached_tokens
        self.lift: LiftRule = lift
        self.ties_to_first_seen = ties_to_first_seen
        self._tree = settings.tree
        self._flat = settings.tree.flat  # every client a child of the root
        self._linear_w_out = self.cost.w_out if isinstance(self.cost, LinearCost) else None
        self._counter: dict[str, float] = {}
        self._levels: dict[str, _Level] = {ROOT: _Level()}
        self._paths: dict[str, tuple[tuple[str, str], ...]] = {}  # client -> (parent, node)..
        self._rank: dict[str, int] = {}
        self._seq = itertools.count()
        self._base: dict[str, float] = {}  # level -> what its children's counters omit
        self._parent: dict[str, str] = {}  # node -> its level (not placed: the top level)
        self.rebase_at = REBASE_AT

    # --- the tree ---
    @property
    def tree(self) -> ShareTree:
        return self._tree

    @tree.setter
    def tree(self, tree: ShareTree) -> None:
        """A reloaded tree (new groups and clients; nobody moved): paths are re-read."""
        self._tree = tree
        self._paths.clear()
        self._flat = tree.flat

    def set_path(self, client: str, nodes: Sequence[str]) -> None:
        """Place `client` at `nodes` (top-level group down to the client itself), for
        drivers that learn the tree request by request (the gateway)."""
        self._paths[client] = self._placed(tuple(zip((ROOT, *nodes[:-1]), nodes, strict=True)))
        if len(nodes) > 1:
            self._flat = False

    def path(self, client: str) -> tuple[tuple[str, str], ...]:
        """(parent, node) pairs from the top level down to the client."""
        path = self._paths.get(client)
        if path is None:
            nodes = self._tree.path(client)
            path = tuple(zip((ROOT, *nodes[:-1]), nodes, strict=True))
            path = self._paths[client] = self._placed(path)
        return path

    def _placed(self, path: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """Record each node's level; a node that changes level keeps its counter."""
        counter, parents, base = self._counter, self._parent, self._base
        for parent, node in path:
            before = parents.get(node, ROOT)
            if before != parent and node in counter:
                counter[node] += base.get(before, 0.0) - base.get(parent, 0.0)
            parents[node] = parent
        return path

    def nodes(self, client: str) -> tuple[str, ...]:
        return tuple(node for _, node in self.path(client))

    # --- counters ---
    def counter(self, node: str) -> float:
        value = self._counter.get(node)  # reported: the level's base added back
        return 0.0 if value is None else value + self._base.get(self._parent.get(node, ROOT), 0.0)

    def counters(self) -> dict[str, float]:
        """The clients' counters."""
        return {n: self.counter(n) for n in self._counter if not is_group(n)}

    def node_counters(self) -> dict[str, float]:
        """Every node's counter, groups (`@path`) and clients."""
        if not self._base:
            return dict(self._counter)
        return {n: self.counter(n) for n in self._counter}

    def level_counter(self, node: str) -> float:
        """The counter as compared with its siblings': less its level's base (Rebasing)."""
        value = self._counter.get(node)
        return self._fresh(self._parent.get(node, ROOT)) if value is None else value

    def _fresh(self, level: str) -> float:  # a node new at `level`: 0, less its base
        return -min(self._base.get(level, 0.0), self.rebase_at)

    def tie_rank(self, node: str) -> int:
        if not self.ties_to_first_seen:
            return 0
        return self._rank.setdefault(node, len(self._rank))

    # --- charges ---
    def charge(self, client: str, service: float) -> None:
        """Add `service` to every node on the client's path, divided by its weight."""
        path = self.path(client)
        counter, weights = self._counter, self.weights
        if len(path) == 1:  # no groups: the usual case, on every output token
            value = counter.get(client)
            value = self._fresh(ROOT) if value is None else value
            counter[client] = value + service / weights.get(client, 1.0)
            return
        for parent, node in path:
            value = counter.get(node)
            value = self._fresh(parent) if value is None else value
            counter[node] = value + service / weights.get(node, 1.0)

    def apply(self, charge: Charge) -> None:
        """Add amounts already divided by each node's weight (`weighted_charge`)."""
        counter, parents = self._counter, self._parent
        for node, amount in charge:
            value = counter.get(node)
            value = self._fresh(parents.get(node, ROOT)) if value is None else value
            counter[node] = value + amount

    def prompt_service(self, request: RequestView) -> float:
        """What the request's prompt costs, its cached tokens at their share."""
        return prompt_cost(
            self.cost, request.input_tokens, request.cached_tokens, self.charge_cached_tokens
        )

    def charge_prompt(self, request: RequestView) -> None:
        self.charge(request.client, self.prompt_service(request))

    def output_service(self, request: RequestView, start: int, end: int) -> float:
        """The cost of chargeable output tokens start+1 .. end."""
        if self._linear_w_out is not None:
            return self._linear_w_out * (end - start)
        return self.cost.output(request.input_tokens, start, end)

    def charge_output(self, request: RequestView, new_tokens: int) -> None:
        """The request generated `new_tokens` more (`num_output_tokens` counts them)."""
        produced = request.num_output_tokens
        w_out = self._linear_w_out
        if w_out is not None:
            # The usual case, on every running request at every step: a linear cost.
            if produced == new_tokens and request.first_token_free:
                new_tokens -= 1  # the first output token, made by the prefill, is free
                if new_tokens <= 0:
                    return
            client = request.client
            if self._flat:  # one counter per client
                counter = self._counter
                value = counter.get(client)
                value = self._fresh(ROOT) if value is None else value
                counter[client] = value + w_out * new_tokens / self.weights.get(client, 1.0)
            else:
                self.charge(client, w_out * new_tokens)
            return
        free = request.first_token_free
        end = chargeable_output(produced, free)
        start = chargeable_output(produced - new_tokens, free)
        if end > start:
            self.charge(request.client, self.cost.output(request.input_tokens, start, end))

    # --- the backlog and the pick ---
    def _level(self, group: str) -> _Level:
        level = self._levels.get(group)
        if level is None:
            level = self._levels[group] = _Level()
        return level

    def _file(self, level: _Level, node: str) -> None:
        seq = next(self._seq)
        level.live[node] = seq
        heapq.heappush(level.heap, (self._counter[node], self.tie_rank(node), seq, node))
        if len(level.heap) > 2 * len(level.live) + 64:
            level.heap = [(self._counter[n], self.tie_rank(n), s, n) for n, s in level.live.items()]
            heapq.heapify(level.heap)

    def _min_child(self, level: _Level) -> str | None:
        heap, counter, live = level.heap, self._counter, level.live
        while heap:
            stored, rank, seq, node = heap[0]
            if live.get(node) != seq:
                heapq.heappop(heap)  # retired entry
            elif stored != counter[node]:
                seq = next(self._seq)  # the counter grew since: file it again
                live[node] = seq
                heapq.heapreplace(heap, (counter[node], rank, seq, node))
            else:
                return node
        return None

    def activate(self, client: str, *, lift: bool = True) -> None:
        """The client's first waiting request: each node on its path that had nothing
        waiting below it is lifted among its siblings (top down, unless `lift` is
        False: a preempted request was being served, not idle) and filed."""
        if self.ties_to_first_seen:
            self.tie_rank(client)  # seen at arrival, before its lift
        for parent, node in self.path(client):
            level = self._level(parent)
            if node in level.live:
                continue  # waiting below already
            counter = self.level_counter(node)
            if lift and self.lift != "none":
                others = self._min_child(level)
                if others is not None:
                    counter = max(counter, self._counter[others])
                elif self.lift == "paper" and level.last is not None:
                    counter = max(counter, self._counter[level.last])
            self._counter[node] = counter
            self._file(level, node)

    def deactivate(self, client: str) -> None:
        """The client's last waiting request left: retire it, and each group above
        that has nothing waiting any more."""
        for parent, node in reversed(self.path(client)):
            level = self._levels[parent]
            del level.live[node]  # its heap entry is retired lazily
            if level.live:
                return

    def refile(self, client: str) -> None:
        """The client's counters shrank (a refund): file its backlogged nodes afresh."""
        for parent, node in self.path(client):
            level = self._levels.get(parent)
            if level is not None and node in level.live:
                self._file(level, node)

    def admitted(self, client: str) -> None:
        """A request of `client` was admitted: the lift's reference at every level."""
        counter = self._counter
        for parent, node in self.path(client):
            level = self._level(parent)
            level.last = node
            if counter.setdefault(node, self._fresh(parent)) >= self.rebase_at:
                self._rebase(parent, level, node)

    def admitted_elsewhere(self, parent: str, node: str) -> None:
        """Another copy of these counters (a gateway replica) admitted `node` last under
        `parent`: the lift's reference there, with no rebase (that copy did its own)."""
        self._counter.setdefault(node, self._fresh(parent))
        self._level(parent).last = node

    def _rebase(self, parent: str, level: _Level, admitted: str) -> None:
        """Move the level's counters down by its reference, when past `rebase_at`."""
        counter = self._counter
        shift = min(counter[admitted], counter[self._min_child(level) or admitted])
        if not shift >= self.rebase_at:
            return
        parents, floor = self._parent, -self.rebase_at
        for node in counter:
            if parents.get(node, ROOT) == parent:
                counter[node] = max(counter[node] - shift, floor)
        self._base[parent] = self._base.get(parent, 0.0) + shift
        # The heap's entries move with their counters (fresh or stale alike, as before).
        level.heap = [(stored - shift, rank, seq, n) for stored, rank, seq, n in level.heap]
        heapq.heapify(level.heap)

    def smallest(self) -> str | None:
        """The backlogged client the descent picks, or None when nobody waits."""
        levels = self._levels
        node = self._min_child(levels[ROOT])
        if self._flat:
            return node
        while node is not None and is_group(node):
            node = self._min_child(levels[node])
        return node

    def backlogged_in_order(self) -> Iterator[str]:
        """The backlogged clients in the order successive picks would take them, were
        each to leave with no charge in between (the heaps' walk, on copies)."""
        yield from self._walk(ROOT)

    def _walk(self, group: str) -> Iterator[str]:
        level = self._levels.get(group)
        if level is None:
            return
        heap, counter, live = list(level.heap), self._counter, dict(level.live)
        seq = itertools.count(max((entry[2] for entry in heap), default=0) + 1)
        while heap:
            stored, rank, entry_seq, node = heapq.heappop(heap)
            if live.get(node) != entry_seq:
                continue  # retired, or listed already
            if stored != counter[node]:
                live[node] = next(seq)  # a re-file takes a seq above every stored one
                heapq.heappush(heap, (counter[node], rank, live[node], node))
                continue
            del live[node]
            if is_group(node):
                yield from self._walk(node)
            else:
                yield node

    def best_of(self, clients: Sequence[str]) -> int:
        """Of `clients` (backlogged or not), the index of the one the descent picks
        among them alone; ties go to the earliest listed."""
        if not clients:
            raise ValueError("best_of needs at least one client")
        value = self.level_counter
        remaining = list(range(len(clients)))
        paths = [self.nodes(client) for client in clients]
        depth = 0
        while len(remaining) > 1:
            best: str | None = None
            for index in remaining:
                node = paths[index][depth]
                if best is None or value(node) < value(best):
                    best = node
            remaining = [index for index in remaining if paths[index][depth] == best]
            if len(paths[remaining[0]]) == depth + 1:
                break  # best is a client
            depth += 1
        return remaining[0]
