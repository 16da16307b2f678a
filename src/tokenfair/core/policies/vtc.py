"""The Virtual Token Counter (Sheng et al., OSDI 2024) and its variants, as a policy.

The counters, the lift, the charges and the pick among clients live in the ledger
(ledger.py), the one copy of VTC's rules; this policy adds the waiting queues: one per
client, in priority order (lower first, vLLM's convention; ties by arrival), so a
client orders its own work and no priority moves it ahead of another client. Whenever
the batch has room, the client the ledger picks sends its head request. With a tree of
groups (core/share_tree.py) the pick descends the tree: hierarchical VTC.

Variants, all this one class:
- lcf: no lift (least counter first), to show why the lift matters;
- the artifact's lift: no lift when nobody else waits (the authors' code);
- length prediction: charge the predicted output at admission, then only tokens
  beyond it, refunding the unused part at finish (predict = moving average per
  client, oracle = the true length);
- preemption: when the head client's counter is more than `preempt_threshold` below a
  running client's, that client's newest request is pushed out to make room;
- seat sharing (when the scheduler shares seats): with every seat taken, a tenant over
  its weighted share of the seats gives one up to a tenant under it (batch_share.py);
- the artifact's queue exactly (`vtc-artifact`): its lift, ties between equal counters
  going to the client seen first (its counters live in a dict in first-arrival order),
  and its charging quirk: whenever a request of the batch finishes, every request of
  that batch is charged one more output token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence

from tokenfair.core.cost import CostFunction
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.client_queues import ClientPick, ClientQueue, WaitingQueue
from tokenfair.core.policies.ledger import CounterLedger, LiftRule, chargeable_output
from tokenfair.core.policies.predictor import OutputLengthPredictor
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.view import RequestView
from tokenfair.core.prefix_cache import PrefixCache
from tokenfair.core.share_tree import ShareTree

__all__ = ["ClientPick", "ClientQueue", "LiftRule", "VTCPolicy", "WaitingQueue"]


class VTCPolicy(Policy):
    """VTC over the ledger: per-client queues, the ledger's pick, its charges; a
    `ClientPick` passed in picks otherwise (the locality-aware variants)."""

    charges_output = True

    def __init__(
        self,
        settings: PolicySettings | None = None,
        *,
        name: str = "vtc",
        lift: LiftRule = "paper",
        predictor: OutputLengthPredictor | None = None,
        preempt_threshold: float | None = None,
        ties_to_first_seen: bool = False,
        charge_batch_on_finish: bool = False,
        pick: ClientPick | None = None,
    ):
        if preempt_threshold is not None and preempt_threshold < 0:
            raise ValueError(f"preemption threshold must be >= 0, got {preempt_threshold}")
        self.name = name
        self.ledger = CounterLedger(settings, lift=lift, ties_to_first_seen=ties_to_first_seen)
        self.predictor = predictor
        self.preempt_threshold = preempt_threshold
        self.charges_batch_on_finish = charge_batch_on_finish
        self._queues: dict[str, WaitingQueue] = {}  # only clients with waiting requests
        self._num_waiting = 0
        self.pick = pick or ClientPick()
        self.pick.bind(self._queues, self.ledger)
        # The request the last peek returned, until the queues change: what pop takes.
        self._peeked: RequestView | None = None
        # Under length prediction: request id -> chargeable output tokens charged so
        # far, ahead of generation.
        self._charged: dict[str, int] = {}
        if predictor is None:
            # Called for every running request at every step: straight to the ledger.
            self.on_output = self.ledger.charge_output  # type: ignore[method-assign]

    # --- what the drivers configure, kept in the ledger ---
    @property
    def weights(self) -> MutableMapping[str, float]:
        return self.ledger.weights

    def reweigh(self, weights: Mapping[str, float], tree: ShareTree | None = None) -> None:
        self.ledger.weights.update(weights)
        if tree is not None:
            self.ledger.tree = tree

    @property
    def cost(self) -> CostFunction:
        return self.ledger.cost

    @property
    def tree(self) -> ShareTree:
        return self.ledger.tree

    @tree.setter
    def tree(self, tree: ShareTree) -> None:
        self.ledger.tree = tree

    # --- the waiting queue ---
    def attach_prefix_cache(self, cache: PrefixCache) -> None:
        self.pick.attach_prefix_cache(cache)

    def add(self, request: RequestView, now: float) -> None:
        self._enter(request, arrival=True)

    def requeue(self, request: RequestView) -> None:
        self._enter(request, arrival=False)

    def _enter(self, request: RequestView, arrival: bool) -> None:
        self._peeked = None
        client = request.client
        queue = self._queues.get(client)
        joined = queue is None
        if queue is None:
            # A preempted request was being served, not idle: no lift.
            self.ledger.activate(client, lift=arrival)
            queue = self._queues[client] = self.pick.new_queue()
        if arrival:
            queue.add(request)
        else:
            queue.requeue(request)
        self._num_waiting += 1
        self.pick.entered(request, joined, arrival)

    def peek(self) -> RequestView | None:
        client = self.pick.choose()
        self._peeked = None if client is None else self._queues[client].head()
        return self._peeked

    def pop(self) -> RequestView:
        request = self._peeked if self._peeked is not None else self.peek()
        if request is None:
            raise IndexError("pop from an empty waiting queue")
        self._take(request, popped=True)
        return request

    def remove(self, request: RequestView) -> None:
        self._take(request, popped=False)

    def _take(self, request: RequestView, popped: bool) -> None:
        """`request` leaves its client's queue (if it waits there)."""
        self._peeked = None
        client = request.client
        queue = self._queues.get(client)
        if queue is None:
            return
        if popped and queue.head() is request:
            queue.pop()
        elif not queue.remove(request):
            return
        self._num_waiting -= 1
        if not queue:
            self._leave(client)
        self.pick.left(request, popped)

    def _leave(self, client: str) -> None:
        del self._queues[client]
        self.ledger.deactivate(client)

    def __len__(self) -> int:
        return self._num_waiting

    def waiting_tenants(self) -> Iterable[str]:
        return self._queues.keys()

    def waiting_requests(self) -> Iterable[RequestView]:
        """Pop order with the counters as they are."""
        for client in self.ledger.backlogged_in_order():
            yield from self._queues[client]

    def waiting_heads(self) -> Iterable[RequestView]:
        for client in self.ledger.backlogged_in_order():
            yield next(iter(self._queues[client]))

    # --- charges ---
    def on_admit(self, request: RequestView, first_time: bool, now: float) -> None:
        # The lift's reference is set here, not at pop: a caller may pop a request and
        # put it back when it does not fit (vLLM's scheduler does), which admits nobody.
        ledger = self.ledger
        ledger.admitted(request.client)
        if first_time:
            # A re-admission after recompute is the system's doing: the prompt is paid once.
            ledger.charge_prompt(request)
        if self.predictor is not None:
            predicted = self.predictor.predict(request)
            charged = self._charged.get(request.request_id, 0)
            if predicted > charged:
                self._charge_output_upto(request, charged, predicted)

    def _charge_output_upto(self, request: RequestView, charged: int, upto: int) -> None:
        """Charge chargeable output tokens charged+1 .. upto (a refund when below)."""
        ledger = self.ledger
        ledger.charge(request.client, ledger.output_service(request, charged, upto))
        self._charged[request.request_id] = upto

    def on_output(self, request: RequestView, new_tokens: int) -> None:
        if self.predictor is None:
            self.ledger.charge_output(request, new_tokens)
            return
        produced = chargeable_output(request.num_output_tokens, request.first_token_free)
        charged = self._charged.get(request.request_id, 0)
        if produced > charged:  # beyond the prediction charged at admission
            self._charge_output_upto(request, charged, produced)

    def on_finish(self, request: RequestView) -> None:
        if self.predictor is None:
            return
        self.predictor.observe(request)
        produced = chargeable_output(request.num_output_tokens, request.first_token_free)
        charged = self._charged.pop(request.request_id, 0)
        if charged > produced:  # refund the unused prediction (a negative charge)
            ledger = self.ledger
            ledger.charge(request.client, ledger.output_service(request, charged, produced))
            if request.client in self._queues:
                ledger.refile(request.client)  # its counter shrank

    def on_batch_finish(self, batch: Sequence[RequestView]) -> None:
        # The artifact's quirk: one more output token's charge for the whole batch.
        ledger = self.ledger
        for request in batch:
            n = request.num_output_tokens
            ledger.charge(request.client, ledger.cost.output(request.input_tokens, n - 1, n))

    def counters(self) -> dict[str, float]:
        """The clients' counters (groups' in `node_counters`)."""
        return self.ledger.counters()

    def node_counters(self) -> dict[str, float]:
        """Every node's counter, groups (`@path`) and clients."""
        return self.ledger.node_counters()

    # --- what contention asks of it ---
    shares_by_weight = True

    def weight_of(self, client: str) -> float:
        return self.ledger.weights.get(client, 1.0)

    def victim_key(self, request: RequestView) -> tuple:
        """Down the tree, the most-served node at each level; its newest request."""
        ledger = self.ledger
        return (*(ledger.counter(node) for _, node in ledger.path(request.client)),
                request.admit_seq)  # fmt: skip

    def preempts_for(self, head: RequestView, candidate: RequestView) -> bool:
        """vtc-preempt: when the candidate's tenant's counter is more than the threshold
        above the head's."""
        if self.preempt_threshold is None:
            return False
        gap = self.ledger.counter(candidate.client) - self.ledger.counter(head.client)
        return gap > self.preempt_threshold
