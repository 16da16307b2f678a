"""The policy API: what a scheduling policy is written against (docs/policies.md).

Everything a policy needs is importable from here, and this is the surface kept stable:
`Policy` (the hooks), `Needs` (what a policy declares it needs and where it runs),
`KeyedPolicy` (a waiting order by a static key), `RequestView`
(what a policy sees of a request), `PolicySettings` (what it is built with),
`CounterLedger` (VTC's counters, for counter policies), `PrefixCache` (what a
locality-aware policy sees of the prefix cache), and `make_policy` (a policy by name or
by `module:Class`).
"""

from tokenfair.core.policies.base import KeyedPolicy, OrderedQueue, Policy
from tokenfair.core.policies.ledger import Charge, CounterLedger, LiftRule
from tokenfair.core.policies.needs import Needs
from tokenfair.core.policies.registry import POLICY_HELP, PolicyError, make_policy
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.view import PolicyRequest, RequestView
from tokenfair.core.prefix_cache import PrefixCache

__all__ = [
    "POLICY_HELP",
    "Charge",
    "CounterLedger",
    "KeyedPolicy",
    "LiftRule",
    "Needs",
    "OrderedQueue",
    "Policy",
    "PolicyError",
    "PolicyRequest",
    "PolicySettings",
    "PrefixCache",
    "RequestView",
    "make_policy",
]
