"""Where the plugin is meant to differ from stock vLLM in vLLM's own scheduler tests.

Keys are test function names (every parametrization shares its entry); docs/vllm.md
lists the same tests with the same reasons, and a test checks the two agree.

With `fcfs` nothing differs. With `fcfs`, vLLM's priority tests (those that configure
`--scheduling-policy priority`) are run but not expected to pass: they test vLLM's
priority order, which is the `priority` policy's job; that pass runs them. With
`priority` nothing differs but vLLM 0.34's cache-aware admission tests, which run
vLLM's FCFS order with the window on (PRIORITY_DIFFERS).
"""

from __future__ import annotations

_ARRIVAL = (
    "the requests reach the scheduler in another order than their arrival_time "
    "stamps; VTC keeps a tenant's requests of equal priority in the order the "
    "scheduler received them, vLLM's priority queue sorts them by arrival_time"
)
_VICTIM = (
    "VTC's victim is the newest admission of the tenant with the largest counter "
    "(with one tenant: the newest admission, whatever its priority); vLLM's priority "
    "scheduler pushes out the lowest-priority request"
)

# vtc, every request from one tenant: test -> why it differs from stock vLLM.
VTC_DIFFERS: dict[str, str] = {
    "test_priority_scheduling_arrival_time_tiebreaker": _ARRIVAL,
    "test_priority_scheduling_equal_priority_preemption": _ARRIVAL,
    "test_priority_scheduling_fcfs_fallback": _ARRIVAL,
    "test_priority_scheduling_mixed_priority_and_arrival": _ARRIVAL,
    "test_priority_scheduling_preemption": _VICTIM,
    "test_priority_scheduling_preemption_and_resumption_when_out_of_kv": _VICTIM,
}

_WINDOW_ORDER = (
    "the test runs vLLM's FCFS order and adds `cold` before `warm`, whose arrival_time "
    "is earlier; tokenfair's `priority` is vLLM's priority order, which sorts equal "
    "priorities by arrival_time (`warm` first), and it turns the cache-aware window off "
    "(stock vLLM turns it off under its priority order too)"
)

# priority, every request from one tenant: test -> why it differs from stock vLLM.
PRIORITY_DIFFERS: dict[str, str] = {
    "test_cache_aware_admission_does_not_look_past_the_window": _WINDOW_ORDER,
    "test_cache_aware_admission_keeps_blocked_and_started_requests_in_place": _WINDOW_ORDER,
    "test_cache_aware_admission_protects_resident_prefix_from_eviction": _WINDOW_ORDER,
    "test_cache_aware_admission_skipped_below_threshold": _WINDOW_ORDER,
    "test_cache_aware_admission_is_safe_on_a_mamba_spec": (
        "the test checks that the window is on; under tokenfair's `priority` it is off, "
        "as under vLLM's own priority order, since re-inserting requests would reorder "
        "the priority queue"
    ),
}
