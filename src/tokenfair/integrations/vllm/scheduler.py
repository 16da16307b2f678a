"""FairScheduler: vLLM's v1 scheduler with a tokenfair policy deciding who runs.

The overrides of vLLM's internals (with queues.py, the queues it installs). vLLM's
internals change between minors, so at import this module checks that what the plugin
uses is there (surface.py: methods with their parameters, attributes, the queue
interface) and refuses, in one line naming what is missing, when it is not; a minor
outside those `make test` ran (TESTED_VLLM) whose surface checks out runs with one
warning. What it overrides, and why:

- `waiting` becomes a `PolicyQueue`: vLLM's `schedule()` peeks and pops it as it
  always does, and gets the head request of the tenant the policy picks (for VTC the
  smallest counter). A request it pops and cannot admit is put back at the front of
  its tenant's queue, unchanged and uncharged. Iterating or indexing it gives the
  order pops would take. `kv_holding_waiting` (requests that hold KV blocks while
  waiting: KV-connector loads, streaming-input sessions) stays vLLM's own kind of
  queue, drained first as in stock vLLM; its requests are charged alike.
  `async_kv_waiting` (vLLM 0.34: requests that may load their KV asynchronously) is a
  second door to the fair queue (`AsyncLoadQueue`). Any other queue is refused.
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

import time
from collections.abc import Callable
from typing import Any

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import (
    RequestQueue,
    SchedulingPolicy,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from tokenfair.core.policies.base import KeyedPolicy
from tokenfair.core.request import FinishReason
from tokenfair.integrations.vllm.config import PluginConfig, load_plugin_config
from tokenfair.integrations.vllm.driver import PolicyDriver
from tokenfair.integrations.vllm.fields import output_hint_of, tenant_of
from tokenfair.integrations.vllm.memory_share import Pool, blocks_asked, walk_memory
from tokenfair.integrations.vllm.metrics import StatusLog, serve_prometheus
from tokenfair.integrations.vllm.policies import PluginPolicy
from tokenfair.integrations.vllm.prefix_cache import VllmPrefixCache
from tokenfair.integrations.vllm.queues import AsyncLoadQueue, HoldingQueue, PolicyQueue
from tokenfair.integrations.vllm.step_share import Prefill, StepPlan
from tokenfair.integrations.vllm.surface import (
    BLOCK_POOL_COUNTS,
    BLOCK_POOL_METHODS,
    KNOWN_QUEUES,
    KV_MANAGER_METHODS,
    check_vllm,
    method_problems,
    surface_problems,
)
from tokenfair.integrations.vllm.tenants_watch import TenantsFileWatch

logger = init_logger("vllm.tokenfair")

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
}


class VllmCacheAccess:
    """The prefix-cache view's access to vLLM's KV cache manager (prefix_cache.py)."""

    def __init__(self, kv_cache_manager: Any, find: Callable[[str], Request]) -> None:
        """`find(request_id)`: the vLLM request the driver knows by that id."""
        self.enabled = bool(kv_cache_manager.enable_caching)
        self._manager = kv_cache_manager
        self._find = find
        # vLLM 0.34+: its own side-effect-free probe (it also honours a request that
        # may not read the cache); before it, None.
        self._num_cached_tokens = getattr(kv_cache_manager, "get_num_cached_tokens", None)

    def block_hashes(self, request_id: str) -> Any:
        return self._find(request_id).block_hashes

    def num_tokens(self, request_id: str) -> int:
        return self._find(request_id).num_tokens

    def cached_tokens(self, request_id: str) -> int:
        request = self._find(request_id)
        if self._num_cached_tokens is not None:
            return int(self._num_cached_tokens(request))
        # Before 0.34: the lookup vLLM makes at admission, without the hit-rate
        # statistics `get_computed_blocks` records.
        _, tokens, *_ = self._manager.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        return int(tokens)

    def follow(self, cached: Callable[[list[Any]], None], evicted: Callable[[], None]) -> None:
        """Wrap the block pool's `cache_full_blocks` and `_maybe_evict_cached_block`.

        vLLM's KV cache events (BlockStored, BlockRemoved) say the same without a wrap,
        but only when the operator enables them (--kv-events-config), and only after
        the step (`update_from_output`), while an eviction during admission must reach
        the policy before its next pick: the wrap keeps the policy's view exact.
        """
        pool = self._manager.block_pool
        cache_full_blocks = pool.cache_full_blocks
        maybe_evict = pool._maybe_evict_cached_block

        def cache_full_blocks_followed(
            request: Any, blocks: Any, num_cached_blocks: int, num_full_blocks: int,
            block_size: int, kv_cache_group_id: int, *args: Any, **kwargs: Any,
        ) -> Any:  # fmt: skip
            result = cache_full_blocks(
                request, blocks, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id, *args, **kwargs,
            )  # fmt: skip
            # One group is enough to follow: a prefix is cached in all or none.
            if kv_cache_group_id == 0 and num_full_blocks > num_cached_blocks:
                cached(list(request.block_hashes[num_cached_blocks:num_full_blocks]))
            return result

        def maybe_evict_followed(block: Any) -> bool:
            evicted_now = bool(maybe_evict(block))
            if evicted_now:
                evicted()
            return evicted_now

        pool.cache_full_blocks = cache_full_blocks_followed
        pool._maybe_evict_cached_block = maybe_evict_followed


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
    max_num_running_reqs: int
    # False on a scheduler built without __init__ (vLLM's tests do): the overrides
    # then leave everything to vLLM.
    _tokenfair_ready = False
    # The step's prompt chunks by request (step_share.py); None: the step is not shared.
    _step_plan: StepPlan | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = load_plugin_config(self.vllm_config.additional_config)
        self.tokenfair_config: PluginConfig = config
        self.plugin_policy: PluginPolicy = config.make_plugin_policy()
        self.driver: PolicyDriver[Request] = PolicyDriver(self.plugin_policy.policy)
        self._tenants_watch = None  # the tenants file, re-read when it changes
        if config.tenants_file is not None:
            tree = config.shares()[1]
            self._tenants_watch = TenantsFileWatch(
                config.tenants_file, self.driver.policy, tree, config.tenants_reload_s, logger
            )
        if self.plugin_policy.prefix_cache:
            # vtc-lpm, vtc-hit and dlpm (and a user's policy that asks for it) order by what
            # vLLM's own prefix cache holds.
            access = VllmCacheAccess(self.kv_cache_manager, self.driver.vllm_request)
            if access.enabled:  # the rest of the surface was checked at import
                pool = type(self.kv_cache_manager.block_pool)
                check_vllm(vllm.__version__, method_problems("BlockPool", pool, BLOCK_POOL_METHODS))
            self.plugin_policy.policy.attach_prefix_cache(VllmPrefixCache(access, self.block_size))
        if config.share_memory:
            manager, pool = self.kv_cache_manager, self.kv_cache_manager.block_pool
            check_vllm(
                vllm.__version__,
                method_problems("KVCacheManager", type(manager), KV_MANAGER_METHODS)
                + method_problems("BlockPool", type(pool), BLOCK_POOL_COUNTS)
                + ([] if hasattr(pool, "num_gpu_blocks") else ["BlockPool.num_gpu_blocks"]),
            )
        chunked = getattr(self.vllm_config.scheduler_config, "enable_chunked_prefill", False)
        if config.step_share_tokens and chunked and self.plugin_policy.sorts_running:
            # vLLM's own orders (fcfs, priority) schedule exactly as stock vLLM does.
            self._step_plan = StepPlan(config.step_share_tokens, self.plugin_policy.policy)
        self._popped: list[Request] = []
        self._warned: set[str] = set()
        # What each tenant held when `running` was last put in victim order, and the
        # tenants whose waiting requests last went after the others' (memory_share.py).
        self.victim_holdings: dict[str, int] = {}
        self.memory_aside: frozenset[str] = frozenset()
        # vLLM's FCFS preemption path takes the tail of `running`, which schedule()
        # keeps in the policy's victim order; its priority path (tokenfair's
        # `priority`) picks the lowest-priority request itself, as stock vLLM does.
        # (--scheduling-policy priority still lets requests carry priorities.)
        self.policy = (
            SchedulingPolicy.PRIORITY if self.plugin_policy.vllm_priority else SchedulingPolicy.FCFS
        )
        # Queues are empty at construction: replace them before any request arrives.
        unknown = [
            name
            for name, value in vars(self).items()
            if isinstance(value, RequestQueue) and name not in KNOWN_QUEUES
        ]
        if unknown:
            raise RuntimeError(
                f"tokenfair cannot schedule vLLM {vllm.__version__}: its scheduler has a "
                f"waiting queue the plugin does not know ({', '.join(unknown)}), whose "
                "requests would run outside the fair order"
            )
        self.waiting = PolicyQueue(self.driver, self._arrive, self._popped, self._settle)
        self.kv_holding_waiting = HoldingQueue(self.policy, self._arrive, self._popped)
        if hasattr(self, "async_kv_waiting"):
            self.async_kv_waiting = AsyncLoadQueue(self.waiting)
        self._keep_cache_aware_window_if_it_keeps_the_order(config.policy)
        rank = getattr(self.vllm_config.parallel_config, "data_parallel_rank", 0) or 0
        self._status = StatusLog(self.driver, config.policy, config.log_interval_s, logger)
        self._metrics_server = None
        if config.metrics_port is not None:
            self._metrics_server = serve_prometheus(
                self.driver, config.metrics_host, config.metrics_port + rank, str(rank)
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

    def _keep_cache_aware_window_if_it_keeps_the_order(self, policy_name: str) -> None:
        """vLLM 0.34's --cache-aware-admission-window moves the waiting requests of a
        window whose prefix is cached to its front, by taking them out and putting
        them back. To the plugin's queue that is a put-back: a request goes to the
        front of its own tenant's queue. Under `fcfs` that is stock vLLM's behaviour,
        and under VTC it reorders a tenant's own requests, never which tenant goes
        next: the window is kept. Under the policies with an order of their own
        (priority, sjf, rpm, and vtc-lpm, vtc-hit and dlpm, which already pick a tenant's
        request with the longest cached prefix) a put-back would break that order:
        the window is turned off, saying so once."""
        if not getattr(self, "cache_aware_window", 0):
            return
        policy = self.plugin_policy.policy
        if isinstance(policy, KeyedPolicy) or self.plugin_policy.prefix_cache:
            self.cache_aware_window = 0
            logger.warning(
                "tokenfair: --cache-aware-admission-window is off under policy %s, whose "
                "order it would break; vtc-lpm, vtc-hit and dlpm are the cache-aware fair policies",
                policy_name,
            )

    def _arrive(self, request: Request, queue: bool) -> None:
        config = self.tokenfair_config
        params = request.sampling_params
        extra = params.extra_args if params is not None else None
        tenant, problem = tenant_of(extra, config.tenant_field, config.default_tenant)
        if problem is not None and problem not in self._warned:
            self._warned.add(problem)
            logger.warning("tokenfair: %s; using tenant %r", problem, config.default_tenant)
        self.driver.arrive(
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
        popped, driver = self._popped, self.driver
        now = time.time()
        pending = []
        for request in popped:
            if request.status != RequestStatus.RUNNING:
                pending.append(request)
                continue
            cached = request.num_computed_tokens
            if scheduled is not None:
                cached -= scheduled.get(request.request_id, 0)
            driver.started(request.request_id, cached, now)
        popped[:] = pending

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self._tokenfair_ready:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        driver = self.driver
        if self._tenants_watch is not None:
            self._tenants_watch.poll()
        share_memory = self.tokenfair_config.share_memory
        held: dict[str, int] | None = None  # read from vLLM only when something needs it
        if self.plugin_policy.sorts_running and len(self.running) > 1:
            if share_memory:
                self.victim_holdings = held = now_held = self._holdings()
                self.running.sort(key=lambda r: driver.holding_victim_key(r.request_id, now_held))
            else:
                self.running.sort(key=lambda r: driver.victim_key(r.request_id))
        aside: frozenset[str] = frozenset()
        if share_memory and len(driver):
            pool = self.kv_cache_manager.block_pool
            aside = walk_memory(
                driver,
                self.running,
                Pool(
                    free_blocks=pool.get_num_free_blocks(),
                    pool_blocks=pool.num_gpu_blocks - 1,  # less the null block
                    block_size=self.block_size,
                    free_seats=self.max_num_running_reqs - len(self.running),
                    holdings=held if held is not None else self._holdings,
                    preempt=self._preempt_for_memory,
                ),
            )
        driver.aside = self.memory_aside = aside
        if self._step_plan is not None:
            driver.aside = aside | self._plan_step()
        self._popped.clear()
        try:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            driver.aside = frozenset()  # outside schedule(), the policy's order
            if self._step_plan is not None:
                self._step_plan.active = False
        if self._popped:
            self._settle(output.num_scheduled_tokens)
            self._popped.clear()  # the rest were put back: not charged
        self._status.tick()
        return output

    def _preempt_for_memory(self, request_id: str) -> int:
        """Push a running request out for a waiting one (memory_share.py), as vLLM's
        own preemption does: off `running`, then `_preempt_request` (its blocks freed,
        back to the front of its tenant's queue). Returns the free blocks after."""
        request = self.requests[request_id]
        self.running.remove(request)
        self._preempt_request(request, time.monotonic())  # type: ignore[attr-defined]
        return int(self.kv_cache_manager.block_pool.get_num_free_blocks())

    def _plan_step(self) -> frozenset[str]:
        """Plan the step's prompt chunks by tenant (step_share.py) before vLLM's pass;
        returns the tenants whose waiting requests go after the others' for the step."""
        plan, driver = self._step_plan, self.driver
        assert plan is not None
        tenant_of = driver.tenant_of
        running = [
            Prefill(
                request.request_id,
                tenant,
                request.num_prompt_tokens,
                request.num_output_tokens,
                request.num_computed_tokens,
            )
            for request in self.running
            if (tenant := tenant_of(request.request_id)) is not None
        ]
        policy = driver.policy
        waiting: list[Prefill] = []
        tenants = set(policy.waiting_tenants())
        for view in policy.waiting_requests():
            if view.client in tenants:
                tenants.discard(view.client)
                waiting.append(_waiting_prefill(view))
                if not tenants:
                    break
        newcomer = None
        first = driver.next_view()
        if first is not None and len(self.running) < self.max_num_running_reqs:
            pool = self.kv_cache_manager.block_pool
            if blocks_asked(first, self.block_size) <= pool.get_num_free_blocks():
                newcomer = _waiting_prefill(first)
        return plan.plan(running, waiting, newcomer)

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        """vLLM's last word on a request's tokens in the step, after its own caps: the
        step share's chunk for it (step_share.py)."""
        tokens = super()._reserve_prefill_lookahead(  # type: ignore[misc]
            request, num_computed_tokens, num_new_tokens
        )
        plan = self._step_plan
        if plan is None or not plan.active:
            return int(tokens)
        if request.status == RequestStatus.RUNNING:
            tenant = None
        elif (tenant := self.driver.tenant_of(request.request_id)) is None:
            return int(tokens)
        left = request.num_tokens - num_computed_tokens
        return plan.chunk(request.request_id, tenant, int(tokens), left)

    def _holdings(self) -> dict[str, int]:
        """KV blocks each tenant's running requests hold (of the first KV cache group;
        a prefix block two requests share counts for each)."""
        held: dict[str, int] = {}
        block_ids, tenant_of = self.kv_cache_manager.get_block_ids, self.driver.tenant_of
        for request in self.running:
            tenant = tenant_of(request.request_id)
            if tenant is not None:
                groups = block_ids(request.request_id)
                held[tenant] = held.get(tenant, 0) + (len(groups[0]) if groups else 0)
        return held

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if not self._tokenfair_ready:
            return outputs
        requests, driver = self.requests, self.driver
        for request_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(request_id)
            if request is not None:
                driver.produced(request_id, request.num_output_tokens)
        return outputs

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if not self._tokenfair_ready:
            return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        reason = _FINISH_REASONS.get(request.status, FinishReason.ABORT)
        self.driver.finished(request.request_id, request.num_output_tokens, reason)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]

    def shutdown(self) -> None:
        if self._tokenfair_ready and self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        super().shutdown()  # type: ignore[misc]


def _waiting_prefill(view: Any) -> Prefill:
    """A waiting request as the step share reads it: nothing computed yet."""
    return Prefill(view.request_id, view.client, view.input_tokens, view.num_output_tokens, 0)


class FairScheduler(FairSchedulerMixin, Scheduler):
    """`--scheduler-cls tokenfair.integrations.vllm.FairScheduler`."""


class FairAsyncScheduler(FairSchedulerMixin, AsyncScheduler):
    """`--scheduler-cls tokenfair.integrations.vllm.FairAsyncScheduler` (async scheduling)."""


# At import: the surface this module uses must be there (one line naming what is not);
# a minor outside the tested range that has it runs, with one warning.
_untested = check_vllm(getattr(vllm, "__version__", "unknown"), surface_problems())
if _untested is not None:
    logger.warning(_untested)
