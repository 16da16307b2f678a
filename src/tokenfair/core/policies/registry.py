"""Policies by name: a built-in one as its module declares it (catalog.py), or a user's
class, `mypkg.mod:MyPolicy(half_life=30)` or an installed name (loading.py)."""

from __future__ import annotations

from tokenfair.core.cost import DEFAULT_COST, CostFunction
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.catalog import (
    BUILTINS,
    HIERARCHICAL_LIFTS,
    POLICY_HELP,
    POLICY_NAMES,
    WEIGHTED_POLICIES,
    PolicyError,
    is_builtin,
)
from tokenfair.core.policies.loading import load_policy
from tokenfair.core.policies.loading import uses_weights as user_policy_uses_weights
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.vtc_family import DEFAULT_PREEMPT_THRESHOLD
from tokenfair.core.share_tree import ShareTree

__all__ = [
    "DEFAULT_PREEMPT_THRESHOLD",
    "POLICY_HELP",
    "POLICY_NAMES",
    "WEIGHTED_POLICIES",
    "PolicyError",
    "is_builtin",
    "make_policy",
    "uses_weights",
]


def uses_weights(spec: str) -> bool:
    """Whether the policy named by `spec` (e.g. `vtc`, `rpm:20`, `mypkg.mod:MyPolicy`)
    reads client weights (a user policy: its class's `needs`)."""
    if not is_builtin(spec):
        return user_policy_uses_weights(spec)
    return spec.strip().partition(":")[0].lower() in WEIGHTED_POLICIES


def make_policy(
    spec: str,
    *,
    weights: dict[str, float] | None = None,
    cost: CostFunction | None = None,
    charge_cached_tokens: float = 1.0,
    tree: ShareTree | None = None,
) -> Policy:
    """Build a policy from its name, e.g. `vtc`, `rpm:20`, `vtc-preempt:1000`, or a
    user's class, `mypkg.mod:MyPolicy(half_life=30)` or an installed name (loading.py).

    `charge_cached_tokens`: what a prompt token served from the prefix cache costs a
    client, as a share of a computed one (1: the paper's cost; 0: only computed tokens).
    With a `tree` of groups, the counter policies share by groups (hierarchical VTC);
    `weights` then names groups (`@org-a`) as well as clients.
    """
    if not 0.0 <= charge_cached_tokens <= 1.0:
        raise PolicyError(
            f"charge_cached_tokens must be between 0 and 1, got {charge_cached_tokens}"
        )
    try:
        # The policy's own copy of the weights: the admin API changes it in place.
        settings = PolicySettings(
            weights=dict(weights or {}),
            cost=cost or DEFAULT_COST,
            tree=tree or ShareTree(),
            charge_cached_tokens=charge_cached_tokens,
        )
    except ValueError as error:
        raise PolicyError(f"policy {spec.strip()!r}: {error}") from None
    if not is_builtin(spec):  # a user's class, `mypkg.mod:MyPolicy(...)` (loading.py)
        return load_policy(spec, settings)
    name, _, text = spec.strip().partition(":")
    name = name.lower()
    declared = BUILTINS.get(name)
    if declared is None:
        known = ", ".join(POLICY_HELP)
        raise PolicyError(f"unknown policy {spec!r}; known policies: {known}")
    if text and declared.argument is None:
        raise PolicyError(f"policy {name!r} takes no argument (got {spec!r})")
    grouped = tree is not None and not tree.flat
    if grouped and declared.needs.groups_lift is None:
        raise PolicyError(
            f"policy {spec!r} does not share by groups; with groups use one of "
            f"{', '.join(HIERARCHICAL_LIFTS)}"
        )
    if declared.needs.weights_required and not grouped and not settings.weights:
        raise PolicyError(f"policy {spec!r} needs client weights (--weights FILE)")
    try:
        argument = 0.0 if declared.argument is None else declared.argument.read(spec, text)
        policy = declared.build(settings, argument)
    except ValueError as error:
        if isinstance(error, PolicyError):
            raise
        message = str(error)
        raise PolicyError(message if spec in message else f"policy {spec!r}: {message}") from None
    policy.needs = declared.needs  # a built-in's object carries its declaration too
    return policy
