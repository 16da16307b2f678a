"""`vtc-hit`: VTC's order, except where VTC's choice would miss the prefix cache.

`vtc-lpm` keeps VTC's order between clients and so, on a pool too small for every
client's working prefix, makes each client's turn a miss: its document was evicted
while the others had theirs. `dlpm` lets every client within a quantum of the least
served go by longest cached prefix, whether or not VTC's own choice would have hit.
This policy deviates from VTC only where that saves a prefill:

- VTC chooses the client (the smallest counter, after the lift); within it, the request
  with the longest cached prefix, as in `vtc-lpm`. If that request finds any of its
  prompt cached, it goes: VTC's choice is a hit.
- Otherwise, among the clients whose counter is below the least served's plus the
  window, the one whose next request has the longest cached prefix goes instead (ties:
  the smallest counter). If none has any, VTC's choice goes, and pays the miss.

So where every prefix fits the pool (or none is shared) it is `vtc-lpm` decision for
decision, and it is never more than the window ahead of the least served: a chosen
client's counter was below the least served's plus the window, so VTC's bound grows by
the window plus the request's own charge, as `dlpm`'s grows by its quantum
(docs/fairness.md). Unlike `dlpm` the window slides with the least served counter, with
no rounds to refill.

A peek costs one look at VTC's choice. On a miss, the clients whose next request hits
are kept in a heap by cached prefix and counter, as `dlpm` keeps its eligible clients:
the answer is near its top, past only the clients more than the window ahead, which
the bound keeps few. A pop takes what the peek before it chose (the VTC queue keeps it).
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenfair.core.policies.cached_heads import CachedHeadHeap
from tokenfair.core.policies.client_queues import WaitingQueue
from tokenfair.core.policies.declaration import Argument, Declared, Needs
from tokenfair.core.policies.ledger import CounterLedger
from tokenfair.core.policies.locality import LongestPrefixPick
from tokenfair.core.policies.view import RequestView
from tokenfair.core.policies.vtc import VTCPolicy

# A window below one document's worth of weighted tokens (prompt + output, the workload
# of docs/experiments.md): a cached client may take a request or two ahead of its turn,
# not a run of them (docs/fairness.md: how it was chosen).
DEFAULT_HIT_WINDOW = 2048.0


class MissAvoidingPick(LongestPrefixPick):
    """`vtc-hit`: VTC's choice when it hits the prefix cache; else the longest cached
    prefix among the clients within `window` weighted tokens of the least served."""

    def __init__(self, window: float = DEFAULT_HIT_WINDOW) -> None:
        if not window > 0:
            raise ValueError(f"window must be > 0, got {window}")
        super().__init__()
        self.window = window

    def bind(self, queues: Mapping[str, WaitingQueue], ledger: CounterLedger) -> None:
        super().bind(queues, ledger)
        # Clients whose next request finds some of its prompt cached.
        self._hits = CachedHeadHeap(self.queues, ledger)

    def choose(self) -> str | None:
        least = self.ledger.smallest()
        if least is None:
            return None
        if self.queues[least].head_blocks() > 0:
            return least  # VTC's choice hits
        return self._nearest_hit(self.ledger.counter(least) + self.window) or least

    def _nearest_hit(self, limit: float) -> str | None:
        """The client below `limit` whose next request has the longest cached prefix
        (ties: the smallest counter, then the entry filed first), or None."""
        hits, beyond, found = self._hits, [], None
        while (top := hits.top()) is not None:
            client, blocks, counter = top
            if blocks == 0:
                hits.retire(client)  # evicted since it was filed
            elif counter >= limit:
                beyond.append(hits.set_aside())  # ahead of the window, for now
            else:
                found = client
                break
        hits.put_back(beyond)
        return found

    def _file(self, client: str, blocks: int) -> None:
        """File the client under its head's `blocks` (none cached: no entry)."""
        if blocks:
            self._hits.file(client, blocks)
        else:
            self._hits.retire(client)

    def _may_have_grown(self, client: str, blocks: int) -> None:
        """One of the client's requests now has `blocks` cached: file the client again
        if that beats its entry (an understated entry would surface too late)."""
        if blocks > (self._hits.filed_blocks(client) or 0):
            self._file(client, self.queues[client].head_blocks())

    def entered(self, request: RequestView, joined: bool, arrival: bool) -> None:
        self._may_have_grown(request.client, self.index.blocks(request))

    def left(self, request: RequestView, popped: bool) -> None:
        queue = self.queues.get(request.client)
        if queue is None:
            self._hits.retire(request.client)  # nothing waits
        else:
            self._file(request.client, queue.head_blocks())

    def prefix_grew(self, client: str, blocks: int) -> None:
        self._may_have_grown(client, blocks)


DECLARED = [
    Declared(
        "vtc-hit",
        "vtc-lpm while VTC's choice finds its prompt cached; on a miss, the longest cached "
        f"prefix among clients within `window` (default {DEFAULT_HIT_WINDOW:g}) weighted "
        "tokens of the least served",
        lambda settings, window: VTCPolicy(settings, name="vtc-hit", pick=MissAvoidingPick(window)),
        argument=Argument("window", DEFAULT_HIT_WINDOW),
        needs=Needs(weights=True, prefix_cache=True),
    )
]
