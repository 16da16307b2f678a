"""The admission queue: requests wait here until an upstream serving their model has room.

One dispatcher task decides, one request at a time, whenever a request arrives or
capacity frees up. Under the shared-counter policies (vtc, wvtc, vtc-artifact, lcf)
each tenant has a FIFO per model; the candidates are every tenant's oldest request for
a model with room, and the counter store picks the one whose tenant has the smallest
counter and charges it in the same atomic step. Under the core's other policies (fcfs,
priority, sjf, rpm:N) a core policy object per model keeps the order, local to this
replica. The chosen request goes where the pool's router (routing.py) sends it.

A request that finds nothing waiting in this gateway and room upstream goes at once,
without a turn of the dispatcher: under the shared-counter policies its lift and charge
are one step of the store (`arrive_and_take`, one round trip to Redis), under the others
the policy admits it on the spot. It is the decision the dispatcher would take, minus
its latency; whenever requests wait, everything goes through the dispatcher.

A request retried after its upstream failed before the first byte goes ahead of every
waiting request and is not charged again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from tokenfair.core.policies import make_policy
from tokenfair.core.policies.base import Policy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.gateway.counters import CounterStore
from tokenfair.gateway.pool import Upstream, UpstreamPool
from tokenfair.gateway.prefix import PrefixKey

RECENT_DISPATCHES = 1000


class AdmissionRefused(Exception):
    """The request cannot wait: 429 for a tenant's limit or rate, 503 for the gateway's."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


@dataclass(eq=False, slots=True)
class Ticket:
    tenant: str
    model: str
    tokens: int  # in-flight tokens it holds: prompt + max_tokens
    charge: float  # charged to the tenant's counter at dispatch (already weighted)
    priority: int = 0
    max_tokens: int = 256
    seq: int = 0
    arrival: float = 0.0
    dispatches_at_arrival: int = 0  # the gateway's dispatch count when this one arrived
    exclude: frozenset[str] = frozenset()
    prefix: PrefixKey | None = None  # what the router places it by
    future: asyncio.Future[Upstream] | None = None
    upstream: Upstream | None = None
    core: Request | None = None
    state: str = "new"  # new -> waiting -> picking -> dispatched -> released
    released: bool = field(default=False)
    recorded: bool = False  # its queueing is in `Admission.recent` (a retry waits no turn)


class Admission:
    def __init__(
        self,
        pool: UpstreamPool,
        policy: str,
        store: CounterStore | None,
        max_waiting: int,
    ) -> None:
        self.pool = pool
        self.store = store  # None: the core policy's order (local to this replica)
        self.policy_spec = policy
        self.max_waiting = max_waiting
        self._seq = itertools.count()
        self._queues: dict[str, dict[str, deque[Ticket]]] = {}  # tenant -> model -> FIFO
        self._policies: dict[str, Policy] = {}  # model -> core policy (local mode)
        self._by_id: dict[str, Ticket] = {}
        self._retries: deque[Ticket] = deque()
        self.waiting: dict[str, int] = {}  # tenant -> waiting requests
        self.running: dict[str, int] = {}  # tenant -> dispatched requests
        self.num_waiting = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        # Dispatches so far, and the queueing of the last ones: how long each waited and
        # how many requests went ahead of it meanwhile (the order, free of clock noise).
        self.dispatches = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_DISPATCHES)
        pool.on_change = self.wake

    # --- lifecycle ---
    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake(self) -> None:
        self._wake.set()

    # --- the request side ---
    async def wait(self, ticket: Ticket, tenant_max_waiting: int) -> Upstream:
        """Queue `ticket` and return the upstream it was dispatched to."""
        if not self.pool.any_eligible(ticket.model):
            raise AdmissionRefused(
                503,
                f"no upstream serving {ticket.model!r} is in rotation; retry later",
                "no_upstream",
            )
        if self.num_waiting >= self.max_waiting:
            raise AdmissionRefused(
                503, "the gateway's waiting queue is full; retry later", "overloaded"
            )
        if self.waiting.get(ticket.tenant, 0) >= tenant_max_waiting:
            raise AdmissionRefused(
                429,
                f"tenant {ticket.tenant!r} already has {tenant_max_waiting} requests waiting",
                "too_many_waiting",
            )
        ticket.seq = next(self._seq)
        ticket.arrival = time.monotonic()
        ticket.dispatches_at_arrival = self.dispatches
        ticket.future = asyncio.get_running_loop().create_future()
        if self.store is None:
            policy = self._policies.get(ticket.model)
            if policy is None:
                policy = self._policies[ticket.model] = make_policy(self.policy_spec)
            core = Request(
                request_id=str(ticket.seq),
                client=ticket.tenant,
                input_tokens=max(1, ticket.tokens - ticket.max_tokens),
                arrival_s=ticket.arrival,
                sampling=SamplingParams(max_tokens=max(1, ticket.max_tokens)),
                priority=ticket.priority,
            )
            if not policy.accept(core, ticket.arrival):
                raise AdmissionRefused(
                    429, f"tenant {ticket.tenant!r} is over its request rate", "rate_limited"
                )
            ticket.core = core
            self._enqueue(ticket)
            policy.add(core, ticket.arrival)
            if self.num_waiting == 1 and not self._retries:
                self._step_local()  # alone: admitted now if an upstream has room
            if ticket.state == "dispatched":
                return ticket.upstream  # type: ignore[return-value]
        else:
            upstream = self._room_now(ticket)
            if upstream is not None:
                return await self._take_now(ticket, upstream)
            self._enqueue(ticket)
        try:
            if self.store is not None:
                # The lift happens before the request is visible to the dispatcher.
                await self.store.arrive(ticket.tenant)
                self._queues.setdefault(ticket.tenant, {}).setdefault(ticket.model, deque()).append(
                    ticket
                )
            self.wake()
            return await ticket.future
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise

    def _room_now(self, ticket: Ticket) -> Upstream | None:
        """An upstream for `ticket` when it may skip the queue: nothing waits here."""
        if self.num_waiting or self._retries:
            return None
        return self.pool.choose(ticket.model, ticket.tokens, prefix=ticket.prefix)

    async def _take_now(self, ticket: Ticket, upstream: Upstream) -> Upstream:
        """Dispatch at once: the slot is held before the store's step, which then runs
        to its end even if the client leaves meanwhile (the charge is then part of the
        dispatch, as for any request that leaves after being dispatched)."""
        assert self.store is not None
        self._dispatch(ticket, upstream)
        if not self.store.remote:  # in this process: runs to its end without suspending
            await self.store.arrive_and_take(ticket.tenant, ticket.charge)
            return upstream
        step = asyncio.ensure_future(self.store.arrive_and_take(ticket.tenant, ticket.charge))
        try:
            await asyncio.shield(step)
        except asyncio.CancelledError:
            self.release(ticket)
            raise
        return upstream

    def _enqueue(self, ticket: Ticket) -> None:
        ticket.state = "waiting"
        self._by_id[str(ticket.seq)] = ticket
        self.waiting[ticket.tenant] = self.waiting.get(ticket.tenant, 0) + 1
        self.num_waiting += 1

    def _unwait(self, ticket: Ticket) -> None:
        self._by_id.pop(str(ticket.seq), None)
        left = self.waiting.get(ticket.tenant, 0) - 1
        if left > 0:
            self.waiting[ticket.tenant] = left
        else:
            self.waiting.pop(ticket.tenant, None)
        self.num_waiting -= 1

    def _abandon(self, ticket: Ticket) -> None:
        """The client went away (or timed out) before its request was dispatched."""
        if ticket.state == "waiting":
            ticket.state = "released"
            self._unwait(ticket)
            if self.store is None:
                assert ticket.core is not None
                self._policies[ticket.model].remove(ticket.core)
            else:
                queue = self._queues.get(ticket.tenant, {}).get(ticket.model)
                if queue is not None and ticket in queue:
                    queue.remove(ticket)
                    self._prune(ticket.tenant, ticket.model)
                self._spawn(self.store.leave(ticket.tenant))
        elif ticket.state == "picking":
            ticket.state = "abandoned"  # the dispatcher refunds it when the pick returns
        elif ticket.state == "dispatched":
            self.release(ticket)
        elif ticket.state == "retrying":
            if ticket in self._retries:
                self._retries.remove(ticket)
            ticket.state = "released"

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def release(self, ticket: Ticket) -> None:
        """The request is over: its upstream slot and tokens are free again."""
        if ticket.upstream is not None and not ticket.released:
            ticket.released = True
            ticket.upstream.release(ticket.tokens)
            left = self.running.get(ticket.tenant, 0) - 1
            if left > 0:
                self.running[ticket.tenant] = left
            else:
                self.running.pop(ticket.tenant, None)
            ticket.state = "released"
            self.wake()

    async def retry(self, ticket: Ticket) -> Upstream | None:
        """After a failure before the first byte: another upstream, ahead of the queue."""
        failed = ticket.upstream
        self.release(ticket)
        assert failed is not None
        ticket.exclude = ticket.exclude | {failed.name}
        if not self.pool.any_eligible(ticket.model, ticket.exclude):
            return None
        ticket.upstream, ticket.released = None, False
        ticket.state = "retrying"
        ticket.future = asyncio.get_running_loop().create_future()
        self._retries.append(ticket)
        self.wake()
        try:
            return await ticket.future
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise

    # --- the dispatcher ---
    def _dispatch(self, ticket: Ticket, upstream: Upstream) -> None:
        upstream.acquire(ticket.tokens)
        if not ticket.recorded:
            ticket.recorded = True
            self.recent.append(
                {
                    "tenant": ticket.tenant,
                    "model": ticket.model,
                    "upstream": upstream.name,
                    "queue_s": round(time.monotonic() - ticket.arrival, 6),
                    "dispatched_ahead": self.dispatches - ticket.dispatches_at_arrival,
                }
            )
        self.dispatches += 1
        ticket.upstream = upstream
        ticket.state = "dispatched"
        self.running[ticket.tenant] = self.running.get(ticket.tenant, 0) + 1
        assert ticket.future is not None
        if not ticket.future.done():
            ticket.future.set_result(upstream)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while await self._step():
                pass

    async def _step(self) -> bool:
        """Dispatch one request if any can go now; False when nothing can."""
        for ticket in list(self._retries):
            upstream = self.pool.choose(ticket.model, ticket.tokens, ticket.exclude, ticket.prefix)
            if upstream is not None:
                self._retries.remove(ticket)
                self._dispatch(ticket, upstream)
                return True
        if self.store is None:
            return self._step_local()
        return await self._step_shared()

    def _step_local(self) -> bool:
        heads: list[tuple[float, Policy, Ticket]] = []
        for model, policy in self._policies.items():
            head = policy.peek()
            if head is None:
                continue
            ticket = self._by_id[head.request_id]
            if self.pool.has_room(model, ticket.tokens, ticket.exclude):
                heads.append((head.arrival_s, policy, ticket))
        if not heads:
            return False
        _, policy, ticket = min(heads, key=lambda h: h[0])
        upstream = self.pool.choose(ticket.model, ticket.tokens, ticket.exclude, ticket.prefix)
        assert upstream is not None  # it had room a moment ago, nothing ran since
        policy.pop()
        assert ticket.core is not None
        policy.on_admit(ticket.core, True, time.monotonic())
        self._unwait(ticket)
        self._dispatch(ticket, upstream)
        return True

    def _prune(self, tenant: str, model: str) -> None:
        models = self._queues.get(tenant)
        if models is not None and not models.get(model, True):
            del models[model]
            if not models:
                del self._queues[tenant]

    async def _step_shared(self) -> bool:
        assert self.store is not None
        heads: list[Ticket] = []
        room: dict[tuple[str, int], bool] = {}
        for models in self._queues.values():
            best: Ticket | None = None
            for model, queue in models.items():
                head = queue[0]
                key = (model, head.tokens)
                if key not in room:
                    room[key] = self.pool.has_room(model, head.tokens)
                if room[key] and (best is None or head.seq < best.seq):
                    best = head
            if best is not None:
                heads.append(best)
        if not heads:
            return False
        heads.sort(key=lambda t: t.seq)  # ties on the counter go to the oldest head
        for ticket in heads:
            ticket.state = "picking"
        tenant = await self.store.pick([(t.tenant, t.charge) for t in heads])
        chosen: Ticket | None = None
        for ticket in heads:
            if ticket.tenant == tenant and chosen is None:
                chosen = ticket
            elif ticket.state == "picking":
                ticket.state = "waiting"
            elif ticket.state == "abandoned":  # left during the pick, never picked
                self._drop_abandoned(ticket, leave=True)
        assert chosen is not None
        if chosen.state == "abandoned":
            # Left while being picked: the pick already counted it out of waiting.
            self.store.charge(chosen.tenant, -chosen.charge)
            self._drop_abandoned(chosen, leave=False)
            return True
        self._queues[chosen.tenant][chosen.model].popleft()
        self._prune(chosen.tenant, chosen.model)
        self._unwait(chosen)
        upstream = self.pool.choose(chosen.model, chosen.tokens, prefix=chosen.prefix)
        if upstream is None:  # capacity vanished during the pick (health change)
            chosen.state = "retrying"
            self._retries.appendleft(chosen)
            return True
        self._dispatch(chosen, upstream)
        return True

    def _drop_abandoned(self, ticket: Ticket, leave: bool) -> None:
        ticket.state = "released"
        queue = self._queues.get(ticket.tenant, {}).get(ticket.model)
        if queue is not None and ticket in queue:
            queue.remove(ticket)
            self._prune(ticket.tenant, ticket.model)
        self._unwait(ticket)
        if leave and self.store is not None:
            self._spawn(self.store.leave(ticket.tenant))
