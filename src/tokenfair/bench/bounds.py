"""VTC's fairness bound (SPEC section 3) and the accumulated service difference it limits.

For the linear cost, the counters of backlogged clients never differ by more than
`B = max(w_in * L_in, w_out * M)`, where `L_in` is the longest prompt and `M` the most
tokens the batch can hold (the KV pool, in tokens); two clients backlogged over an
interval receive service within `2 B` of each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenfair.workloads.trace import TraceRecord

W_IN = 1.0
W_OUT = 2.0


def service_bound(
    records: Iterable[TraceRecord], kv_tokens: int, w_in: float = W_IN, w_out: float = W_OUT
) -> float:
    """B = max(w_in * L_in, w_out * M) for a workload served with a `kv_tokens` pool."""
    longest_prompt = max((r.input_tokens for r in records), default=0)
    return max(w_in * longest_prompt, w_out * kv_tokens)


def backlogged_service_difference(report: dict[str, Any]) -> tuple[list[float], str]:
    """The accumulated service difference curve the bound speaks about, and its scope.

    Over the clients backlogged (nearly) throughout when there are two or more of them;
    otherwise over every served client (the artifact's curve), which then also counts
    clients that simply asked for less.
    """
    if len(report["backlogged"]) >= 2:
        return list(report["acc_service_diff_backlogged"]), "backlogged clients"
    return list(report["acc_service_diff"]), "all served clients"
