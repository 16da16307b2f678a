"""The built-in policies, as their modules declare them (declaration.py), and every
table read from those declarations.

Adding a built-in policy: write it in its own module with a `DECLARED` list, and name
the module in `_MODULES` below; nothing else lists policies. Apart from the registry
that builds them, so that the loader of policies of one's own (loading.py), which must
know the built-in names (they win over a user's of the same name), and the registry,
which hands user specs to the loader, do not import each other.
"""

from __future__ import annotations

from tokenfair.core.policies import fcfs, locality, miss_avoiding, priority, rpm, sjf, vtc_family
from tokenfair.core.policies.declaration import Declared
from tokenfair.core.policies.ledger import LiftRule

_MODULES = (fcfs, priority, sjf, rpm, vtc_family, locality, miss_avoiding)


class PolicyError(ValueError):
    """A policy name or argument that cannot be used; the message says what to fix."""


BUILTINS: dict[str, Declared] = {
    declared.name: declared for module in _MODULES for declared in module.DECLARED
}

# What the CLI's help lists: `sjf[:aging]` -> what it does.
POLICY_HELP: dict[str, str] = {d.usage: d.help for d in BUILTINS.values()}
# The built-in names, without their arguments: these win over a user policy's spec
# (loading.py) of the same name.
POLICY_NAMES = frozenset(BUILTINS)
# Policies whose order depends on client weights; the others ignore them.
WEIGHTED_POLICIES = frozenset(name for name, d in BUILTINS.items() if d.needs.weights)
# The counter policies that share by groups, and their lift rules.
HIERARCHICAL_LIFTS: dict[str, LiftRule] = {
    name: d.needs.groups_lift for name, d in BUILTINS.items() if d.needs.groups_lift
}
# The counter policies whose counters gateway replicas share through Redis, and their
# lift rules; and those a gateway replica runs on its own.
SHARED_COUNTER_LIFTS: dict[str, LiftRule] = {
    name: d.needs.shared_lift for name, d in BUILTINS.items() if d.needs.shared_lift
}
PER_REPLICA_POLICIES = tuple(name for name, d in BUILTINS.items() if d.needs.per_replica)
# The policies the vLLM plugin runs inside vLLM's batch loop.
VLLM_POLICIES = tuple(name for name, d in BUILTINS.items() if d.needs.vllm)


def usage(names: tuple[str, ...] | list[str]) -> list[str]:
    """The names as the help lists them (`sjf[:aging]`, `rpm:N`)."""
    return [BUILTINS[name].usage for name in names]


def is_builtin(spec: str) -> bool:
    """Whether `spec` names a built-in policy (`vtc`, `rpm:20`), not a user's class."""
    return spec.strip().partition(":")[0].lower() in POLICY_NAMES
