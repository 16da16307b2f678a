"""The built-in policies' names, what each does, and the error a bad policy spec gets.

Apart from the registry that builds them, so that the loader of policies of one's own
(loading.py), which must know the built-in names (they win over a user's of the same
name), and the registry, which hands user specs to the loader, do not import each other.
"""

from __future__ import annotations

from tokenfair.core.policies.locality import DEFAULT_QUANTUM
from tokenfair.core.policies.miss_avoiding import DEFAULT_HIT_WINDOW

# Tuned on the arena trace (docs/fairness.md): lower thresholds preempt more and cost
# throughput in recomputation; higher ones rarely preempt at all.
DEFAULT_PREEMPT_THRESHOLD = 3000.0


class PolicyError(ValueError):
    """A policy name or argument that cannot be used; the message says what to fix."""


POLICY_HELP: dict[str, str] = {
    "fcfs": "first come, first served (arrival order)",
    "priority": "per-request priority, lower value first; preempts the lowest priority",
    "sjf[:aging]": "shortest predicted output first; waiting ages `aging` tokens/s (default 10)",
    "rpm:N": "FCFS plus at most N accepted requests per client per sliding 60 s",
    "lcf": "least counter first: VTC without the lift",
    "vtc": "Virtual Token Counter with the paper's lift rule",
    "wvtc": "weighted VTC: service shared in proportion to client weights (needs weights)",
    "vtc-artifact": "the paper artifact's VTC queue exactly: its lift (none when nobody else "
    "waits), ties to the client seen first, and an extra output charge for the whole batch "
    "whenever one of its requests finishes",
    "vtc-predict": "VTC charging a per-client moving-average output prediction up front",
    "vtc-oracle": "VTC charging the true output length up front (experiments only)",
    "vtc-preempt[:threshold]": "VTC that preempts an over-served client's newest request "
    f"when a waiting client is more than `threshold` (default {DEFAULT_PREEMPT_THRESHOLD:g}) behind",
    "vtc-lpm": "VTC between clients; within the chosen client, the request with the longest "
    "cached prefix first",
    "vtc-hit[:window]": "vtc-lpm while VTC's choice finds its prompt cached; on a miss, the "
    f"longest cached prefix among clients within `window` (default {DEFAULT_HIT_WINDOW:g}) "
    "weighted tokens of the least served",
    "dlpm[:quantum]": "deficit longest prefix match: among clients within `quantum` (default "
    f"{DEFAULT_QUANTUM:g}) weighted tokens of the least served, the longest cached prefix first",
}
# The built-in names, without their arguments: these win over a user policy's spec
# (loading.py) of the same name.
POLICY_NAMES = frozenset(key.partition(":")[0].partition("[")[0] for key in POLICY_HELP)


# Policies whose order depends on client weights; the others ignore them.
WEIGHTED_POLICIES = frozenset(
    {
        "lcf",
        "vtc",
        "wvtc",
        "vtc-artifact",
        "vtc-predict",
        "vtc-oracle",
        "vtc-preempt",
        "vtc-lpm",
        "vtc-hit",
        "dlpm",
    }
)


def is_builtin(spec: str) -> bool:
    """Whether `spec` names a built-in policy (`vtc`, `rpm:20`), not a user's class."""
    return spec.strip().partition(":")[0].lower() in POLICY_NAMES
