"""What the plugin uses of vLLM's scheduler, and the check at import that a vLLM has it.

vLLM's internals change between minors: every method (with the leading parameters it
relies on), attribute and queue the plugin touches is listed here, in one place to read
a new minor against (docs/vllm.md lists the same). `surface_problems` names what a
vLLM lacks; `check_vllm` refuses it in one line, or warns for a minor outside those
`make test` ran (TESTED_VLLM) whose surface checks out.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from vllm.v1.core.sched.request_queue import (
    RequestQueue,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from tokenfair.integrations.vllm.queues import AsyncLoadQueue, HoldingQueue, PolicyQueue

# The vLLM minors `make test` runs the plugin's tests and vLLM's own scheduler tests on.
TESTED_VLLM = ((0, 32), (0, 33), (0, 34))

# What the plugin uses of vLLM's scheduler, checked at import (`surface_problems`):
# methods it overrides or calls, with the leading parameters it relies on, and the
# attributes it reads, defined on the class or set by its __init__.
SCHEDULER_METHODS: dict[str, tuple[str, ...]] = {
    "schedule": (),
    "update_from_output": ("scheduler_output", "model_runner_output"),
    "_free_request": ("request",),
    "add_request": ("request",),
    "shutdown": (),
    # Memory for a waiting request (memory_share.py): vLLM's own preemption, called as
    # vLLM's reset_prefix_cache does, on a request the plugin took off `running`.
    "_preempt_request": ("request", "timestamp"),
    # The step share (step_share.py): vLLM's last word on each request's tokens in a
    # step, after its own caps, in the running loop and the waiting loop alike.
    "_reserve_prefill_lookahead": ("request", "num_computed_tokens", "num_new_tokens"),
}
SCHEDULER_ATTRIBUTES = (
    "vllm_config",
    "running",
    "requests",
    "waiting",
    "kv_holding_waiting",
    "policy",
    "kv_cache_manager",
    "block_size",
    "max_num_running_reqs",
)
REQUEST_ATTRIBUTES = (
    "request_id",
    "sampling_params",
    "priority",
    "arrival_time",
    "status",
    "num_computed_tokens",
    "max_tokens",
    "num_prompt_tokens",
    "num_output_tokens",
    "num_tokens",
    "block_hashes",
)

REQUEST_STATUSES = ("RUNNING", "FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")
# The block pool's methods the locality policies follow (VllmCacheAccess.follow).
BLOCK_POOL_METHODS: dict[str, tuple[str, ...]] = {
    "cache_full_blocks": (
        "request",
        "blocks",
        "num_cached_blocks",
        "num_full_blocks",
        "block_size",
        "kv_cache_group_id",
    ),
    "_maybe_evict_cached_block": ("block",),
}
# The KV cache manager's and block pool's methods the memory share reads (share_memory).
KV_MANAGER_METHODS: dict[str, tuple[str, ...]] = {"get_block_ids": ("request_id",)}
BLOCK_POOL_COUNTS: dict[str, tuple[str, ...]] = {"get_num_free_blocks": ()}
# vLLM's waiting queues this module knows what to do with: the fair queue, the queue of
# requests holding KV blocks, and (0.34) the queue of requests that may load their KV
# asynchronously. A scheduler with any other queue is refused: its requests would be
# admitted outside the fair order and never charged.
KNOWN_QUEUES = ("waiting", "kv_holding_waiting", "async_kv_waiting")


def _init_names(function: Any, depth: int = 0) -> set[str]:
    """The names an `__init__` assigns or reads, through the wrappers around it (a
    function that calls the original through its closure, or `functools.wraps`)."""
    names: set[str] = set()
    code = getattr(function, "__code__", None)
    if code is None or depth > 3:
        return names
    names.update(code.co_names)
    inner = [getattr(function, "__wrapped__", None)]
    inner += [cell.cell_contents for cell in function.__closure__ or () if _filled(cell)]
    for candidate in inner:
        if callable(candidate):
            names |= _init_names(candidate, depth + 1)
    return names


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _sets_attribute(cls: type, name: str) -> bool:
    """`name` is defined on `cls` or assigned by an `__init__` in its MRO (read from the
    compiled code: an assignment `self.name = ...` names it)."""
    if hasattr(cls, name):
        return True
    return any(name in _init_names(vars(k).get("__init__")) for k in cls.__mro__)


def _parameters_problem(owner: str, method: Any, expected: tuple[str, ...]) -> str | None:
    names = [
        p.name
        for p in inspect.signature(method).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    if tuple(names[: len(expected)]) != expected:
        return f"{owner}.{method.__name__}({', '.join(expected)}, ...) (found ({', '.join(names)}))"
    return None


def _defined_below(cls: type, base: type) -> set[str]:
    """The names `cls` and its bases up to `base` (not included) define."""
    return {name for klass in cls.__mro__[: cls.__mro__.index(base)] for name in vars(klass)}


def method_problems(owner: str, cls: type, methods: dict[str, tuple[str, ...]]) -> list[str]:
    problems = []
    for name, parameters in methods.items():
        method = getattr(cls, name, None)
        if not callable(method):
            problems.append(f"{owner}.{name}()")
        elif (problem := _parameters_problem(owner, method, parameters)) is not None:
            problems.append(problem)
    return problems


def surface_problems(
    scheduler: type = Scheduler,
    request: type = Request,
    queue: type = RequestQueue,
    block_pool: type | None = None,
) -> list[str]:
    """What of the surface this module needs the given vLLM classes lack, one item each."""
    problems = method_problems("Scheduler", scheduler, SCHEDULER_METHODS)
    problems += [
        f"Scheduler.{n}" for n in SCHEDULER_ATTRIBUTES if not _sets_attribute(scheduler, n)
    ]
    problems += [f"Request.{n}" for n in REQUEST_ATTRIBUTES if not _sets_attribute(request, n)]
    problems += [f"RequestStatus.{n}" for n in REQUEST_STATUSES if not hasattr(RequestStatus, n)]
    # A queue method vLLM requires that one of the plugin's queues does not implement.
    abstract = sorted(getattr(queue, "__abstractmethods__", ()))
    for plugin_queue in (PolicyQueue, HoldingQueue, AsyncLoadQueue):
        implemented = _defined_below(plugin_queue, RequestQueue)
        problems += [
            f"RequestQueue.{n} (not implemented by {plugin_queue.__name__})"
            for n in abstract
            if n not in implemented
        ]
    if block_pool is not None:
        problems += method_problems("BlockPool", block_pool, BLOCK_POOL_METHODS)
    return problems


def _minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def _tested_range() -> str:
    (a, b), (c, d) = TESTED_VLLM[0], TESTED_VLLM[-1]
    return f"{a}.{b} to {c}.{d}"


def check_vllm(version: str, problems: list[str]) -> str | None:
    """Raise ImportError, in one line, when the surface is incomplete; otherwise the
    warning to log for a minor outside the tested range (None inside it)."""
    if problems:
        raise ImportError(
            f"tokenfair.integrations.vllm cannot run on vLLM {version}: its scheduler "
            f"lacks {'; '.join(problems)} (tested with vLLM {_tested_range()})"
        )
    minor = _minor(version)
    if minor is not None and TESTED_VLLM[0] <= minor <= TESTED_VLLM[-1]:
        return None
    return (
        f"tokenfair was tested with vLLM {_tested_range()}; vLLM {version}'s scheduler "
        "has every method and attribute the plugin uses, so it runs: check its "
        "fairness (docs/vllm.md) before relying on it"
    )
