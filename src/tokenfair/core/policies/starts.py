"""The one rule for telling a policy that a request starts running, shared by every
driver (the core's scheduler, the vLLM plugin's driver, the gateway's ordering
policies):

- its first start pays the prompt, priced with what the prefix cache held then;
- a start after a preemption pays nothing again: the recompute is the system's doing;
- every start takes the next admission number (`admit_seq`: the newest is the first
  victim).

A driver tells the policy `on_admit` here and nowhere else, so the three stay
together. (The gateway's counter policies charge through the shared counters instead,
gateway/replicas/counters.py, by the same ledger: a request it dispatches is never
preempted or started again there, so its one start is its dispatch.)
"""

from __future__ import annotations

import itertools
from typing import Protocol

from tokenfair.core.policies.base import Policy


class Starting(Protocol):
    """What a driver's request carries for this rule (a core `Request`, a plugin's
    `PolicyRequest`)."""

    client: str
    input_tokens: int
    ever_admitted: bool
    cached_tokens: int
    admit_seq: int


class Starts:
    """Starts requests under `policy`, numbering them in the order they start."""

    __slots__ = ("_seq", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._seq = itertools.count()

    def start(self, request: Starting, cached_tokens: int, now: float) -> bool:
        """`request` runs from now, `cached_tokens` of its prompt found in the prefix
        cache; True if this is its first start (its prompt charged)."""
        first_time = not request.ever_admitted
        if first_time:
            request.cached_tokens = cached_tokens
        request.ever_admitted = True
        request.admit_seq = next(self._seq)
        self.policy.on_admit(request, first_time, now)  # type: ignore[arg-type]
        return first_time
