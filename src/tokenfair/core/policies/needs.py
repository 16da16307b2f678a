"""What a policy needs from its driver and which drivers run it: the declaration every
policy makes, built-in (declaration.py) or of one's own (a class attribute,
`needs = Needs(weights=True)`)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenfair.core.policies.ledger import LiftRule


@dataclass(frozen=True, slots=True)
class Needs:
    """What a policy needs from its driver, and which drivers run it."""

    # Its order depends on tenant weights: the drivers pass them, and do not warn
    # that they are ignored.
    weights: bool = False
    # It refuses to run without weights (`wvtc`: weighted by definition).
    weights_required: bool = False
    # It orders by what the prefix cache holds: its driver hands it a view of the cache
    # (`attach_prefix_cache`; inside vLLM, a view of vLLM's).
    prefix_cache: bool = False
    # It shares by groups of tenants (hierarchical VTC), lifting a newcomer by this rule;
    # None: it runs only with flat tenants.
    groups_lift: LiftRule | None = None
    # Gateway replicas can share its counters through Redis, lifting by this rule (the
    # gateway decides with the core's ledger, not with the policy object).
    shared_lift: LiftRule | None = None
    # The gateway runs it in each replica on its own (a waiting order by a static key).
    per_replica: bool = False
    # It runs inside vLLM's batch loop (the plugin): it only orders, charges and picks
    # victims, what a vLLM waiting queue can do (not: reject at arrival, preempt for
    # fairness, know the true output length).
    vllm: bool = True
