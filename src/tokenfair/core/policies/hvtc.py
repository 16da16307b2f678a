"""Hierarchical VTC: the Virtual Token Counter at every level of a tree of groups.

Every node (group or client, `core/share_tree.py`) has a counter of the service its
subtree received, divided by the node's own weight among its siblings. Each group runs
VTC among its children:

- **charges** go to every node on the client's path: a service of s adds s / w_n to
  each node n from the top-level group down to the client;
- **the lift** applies at each level: when a client's request arrives and the client
  had nothing waiting, each node on its path that had no waiting request in its subtree
  is lifted to the smallest counter among its parent's children that have waiting
  requests, or, with none, to the counter of the child its parent admitted last (the
  paper's rule; `lcf` never lifts, the artifact's rule skips the second case);
- **the choice** descends the tree: from the root, the child with waiting requests and
  the smallest counter, down to a client, whose oldest (or most urgent) request goes.

So backlogged siblings share their parent's service by weight, and a group with
nothing waiting leaves its share to its busy siblings (work conserving). A tree with no
group is plain weighted VTC: one level, the same decisions as `VTCPolicy`
(tests/core/test_hvtc.py checks it).

Each group keeps a heap of its children with waiting requests, with one live entry per
child, as `VTCPolicy` does for clients: a stale entry (its counter grew) is re-filed
when it reaches the top. A decision is O(depth x log(children)).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence

from tokenfair.core.cost import CostFunction, LinearCost, prompt_cost
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.vtc import ClientQueue, LiftRule
from tokenfair.core.request import Request
from tokenfair.core.share_tree import ROOT, ShareTree, is_group


class _Level:
    """One group's children with waiting requests: a heap by counter, one live entry
    per child, and the child it admitted last (the lift's reference)."""

    __slots__ = ("heap", "last", "live")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, str]] = []  # (counter when filed, seq, child)
        self.live: dict[str, int] = {}  # child -> seq of its one valid entry
        self.last: str | None = None


class HierarchicalVTCPolicy(Policy):
    charges_output = True

    def __init__(
        self,
        tree: ShareTree,
        *,
        name: str = "hvtc",
        weights: dict[str, float] | None = None,
        cost: CostFunction | None = None,
        lift: LiftRule = "paper",
    ) -> None:
        if lift not in ("paper", "artifact", "none"):
            raise ValueError(f"unknown lift rule {lift!r}: expected paper, artifact or none")
        for node, weight in (weights or {}).items():
            if not weight > 0:
                raise ValueError(f"weight of {node!r} must be > 0, got {weight}")
        self.name = name
        self.tree = tree
        # Node id -> weight among its siblings; the admin API changes it in place.
        self.weights = dict(weights or {})
        self.cost = cost or LinearCost()
        self._linear_w_out = self.cost.w_out if isinstance(self.cost, LinearCost) else None
        self.lift = lift
        self._counter: dict[str, float] = {}
        self._levels: dict[str, _Level] = {ROOT: _Level()}  # group (or ROOT) -> level
        self._queues: dict[str, ClientQueue] = {}  # clients with waiting requests
        self._paths: dict[str, tuple[tuple[str, str], ...]] = {}  # client -> (parent, node)...
        self._seq = itertools.count()
        self._num_waiting = 0

    # --- the tree ---
    def _path(self, client: str) -> tuple[tuple[str, str], ...]:
        """(parent, node) pairs from the top level down to the client."""
        path = self._paths.get(client)
        if path is None:
            nodes = self.tree.path(client)
            path = self._paths[client] = tuple(zip((ROOT, *nodes[:-1]), nodes, strict=True))
        return path

    def _level(self, group: str) -> _Level:
        level = self._levels.get(group)
        if level is None:
            level = self._levels[group] = _Level()
        return level

    def _file(self, level: _Level, node: str) -> None:
        seq = next(self._seq)
        level.live[node] = seq
        heapq.heappush(level.heap, (self._counter[node], seq, node))
        if len(level.heap) > 2 * len(level.live) + 64:
            level.heap = [(self._counter[n], s, n) for n, s in level.live.items()]
            heapq.heapify(level.heap)

    def _min_child(self, level: _Level) -> str | None:
        heap, counter, live = level.heap, self._counter, level.live
        while heap:
            stored, seq, node = heap[0]
            if live.get(node) != seq:
                heapq.heappop(heap)  # retired entry
            elif stored != counter[node]:
                seq = next(self._seq)  # the counter grew since: re-file it
                live[node] = seq
                heapq.heapreplace(heap, (counter[node], seq, node))
            else:
                return node
        return None

    def _activate(self, client: str, lift: bool) -> None:
        """The client's first waiting request: each node on its path that had nothing
        waiting below it is lifted among its siblings (top down) and filed."""
        for parent, node in self._path(client):
            level = self._level(parent)
            if node in level.live:
                continue  # waiting below already; so is everything above
            counter = self._counter.get(node, 0.0)
            if lift and self.lift != "none":
                others = self._min_child(level)
                if others is not None:
                    counter = max(counter, self._counter[others])
                elif self.lift == "paper" and level.last is not None:
                    counter = max(counter, self._counter[level.last])
            self._counter[node] = counter
            self._file(level, node)

    def _deactivate(self, client: str) -> None:
        """The client's last waiting request left: retire it, and each group above
        that has nothing waiting any more."""
        del self._queues[client]
        for parent, node in reversed(self._path(client)):
            level = self._levels[parent]
            del level.live[node]  # its heap entry is retired lazily
            if level.live:
                return

    def _descend(self) -> str | None:
        node = self._min_child(self._levels[ROOT])
        while node is not None and node not in self._queues:
            node = self._min_child(self._levels[node])
        return node

    # --- the waiting queue ---
    def add(self, request: Request, now: float) -> None:
        queue = self._queues.get(request.client)
        if queue is None:
            self._activate(request.client, lift=True)
            queue = self._queues[request.client] = ClientQueue()
        queue.add(request)  # by priority, then arrival
        self._num_waiting += 1

    def requeue(self, request: Request) -> None:
        # A preempted request was being served, not idle: no lift.
        queue = self._queues.get(request.client)
        if queue is None:
            self._activate(request.client, lift=False)
            queue = self._queues[request.client] = ClientQueue()
        queue.requeue(request)  # first among its equals: it was running
        self._num_waiting += 1

    def peek(self) -> Request | None:
        client = self._descend()
        return None if client is None else self._queues[client].head()

    def pop(self) -> Request:
        client = self._descend()
        if client is None:
            raise IndexError("pop from an empty waiting queue")
        queue = self._queues[client]
        request = queue.pop()
        if not queue:
            self._deactivate(client)
        self._num_waiting -= 1
        return request

    def remove(self, request: Request) -> None:
        queue = self._queues.get(request.client)
        if queue is None or not queue.remove(request):
            return
        self._num_waiting -= 1
        if not queue:
            self._deactivate(request.client)

    def __len__(self) -> int:
        return self._num_waiting

    def waiting_requests(self) -> Iterable[Request]:
        for queue in self._queues.values():
            yield from queue

    # --- charges ---
    def _charge(self, client: str, service: float) -> None:
        counter, weights = self._counter, self.weights
        for _, node in self._path(client):
            counter[node] = counter.get(node, 0.0) + service / weights.get(node, 1.0)

    def on_admit(self, request: Request, first_time: bool, now: float) -> None:
        for parent, node in self._path(request.client):
            self._level(parent).last = node
            self._counter.setdefault(node, 0.0)
        if first_time:
            # A re-admission after recompute is the system's doing: the prompt is paid once.
            prompt = prompt_cost(
                self.cost, request.input_tokens, request.cached_tokens, self.charge_cached_tokens
            )
            self._charge(request.client, prompt)

    def on_output(self, request: Request) -> None:
        produced = len(request.output_token_ids) - (0 if self.charge_first_token else 1)
        charged = request.charged_output
        if produced <= charged:
            return
        if self._linear_w_out is None:
            amount = self.cost.output(request.input_tokens, charged, produced)
        else:
            amount = self._linear_w_out * (produced - charged)
        self._charge(request.client, amount)
        request.charged_output = produced

    def counters(self) -> dict[str, float]:
        """The clients' counters (groups' in `node_counters`)."""
        return {n: c for n, c in self._counter.items() if not is_group(n)}

    def node_counters(self) -> dict[str, float]:
        """Every node's counter, groups (`@path`) and clients."""
        return dict(self._counter)

    # --- preemption ---
    def victim_key(self, request: Request) -> tuple:
        """Down the tree, the most-served node at each level; its newest request."""
        counter = self._counter
        return (*(counter.get(node, 0.0) for _, node in self._path(request.client)),
                request.admit_seq)  # fmt: skip

    def preempt_for(self, head: Request, running: Sequence[Request]) -> Request | None:
        return None
