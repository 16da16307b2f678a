"""Policies by name: `fcfs`, `priority`, `sjf[:aging]`, `rpm:N`, `lcf`, `vtc`, `wvtc`,
`vtc-artifact`, `vtc-predict`, `vtc-oracle`, `vtc-preempt[:threshold]`, `vtc-lpm`,
`vtc-hit[:window]`, `dlpm[:quantum]`."""

from __future__ import annotations

from collections.abc import Callable

from tokenfair.core.cost import DEFAULT_COST, CostFunction
from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.core.policies.ledger import LiftRule
from tokenfair.core.policies.loading import load_policy
from tokenfair.core.policies.loading import uses_weights as user_policy_uses_weights
from tokenfair.core.policies.locality import DEFAULT_QUANTUM, DeficitLPMPolicy, LocalityVTCPolicy
from tokenfair.core.policies.miss_avoiding import DEFAULT_HIT_WINDOW, MissAvoidingVTCPolicy
from tokenfair.core.policies.names import (
    DEFAULT_PREEMPT_THRESHOLD,
    POLICY_HELP,
    POLICY_NAMES,
    WEIGHTED_POLICIES,
    PolicyError,
    is_builtin,
)
from tokenfair.core.policies.predictor import OraclePredictor, OutputLengthPredictor
from tokenfair.core.policies.priority import PriorityPolicy
from tokenfair.core.policies.rpm import RPMPolicy
from tokenfair.core.policies.settings import PolicySettings
from tokenfair.core.policies.sjf import SJFPolicy
from tokenfair.core.policies.vtc import VTCPolicy
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
    reads client weights (a user policy: its class's `uses_weights`)."""
    if not is_builtin(spec):
        return user_policy_uses_weights(spec)
    return spec.strip().partition(":")[0].lower() in WEIGHTED_POLICIES


def _number(spec: str, arg: str | None, default: float | None) -> float:
    if arg is None or arg == "":
        if default is None:
            raise PolicyError(f"policy {spec!r} needs an argument, e.g. rpm:20")
        return default
    try:
        return float(arg)
    except ValueError:
        raise PolicyError(f"policy {spec!r}: argument {arg!r} is not a number") from None


def _rate_limit(spec: str, arg: str | None) -> int:
    if not arg:
        raise PolicyError(f"policy {spec!r} needs a limit, e.g. rpm:20")
    if not arg.isdigit() or int(arg) < 1:
        raise PolicyError(
            f"policy {spec!r}: the limit must be a whole number of requests per minute "
            f">= 1, e.g. rpm:20 (got {arg!r})"
        )
    return int(arg)


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
    name, _, arg = spec.strip().partition(":")
    name = name.lower()
    if tree is not None and not tree.flat:
        return _hierarchical(spec, name, arg, settings)
    builders: dict[str, Callable[[], Policy]] = {
        "fcfs": FCFSPolicy,
        "priority": PriorityPolicy,
        "sjf": lambda: SJFPolicy(aging=_number(spec, arg, 10.0)),
        "rpm": lambda: RPMPolicy(limit=_rate_limit(spec, arg)),
        "lcf": lambda: VTCPolicy(settings, name="lcf", lift="none"),
        "vtc": lambda: VTCPolicy(settings, name="vtc"),
        "wvtc": lambda: _weighted(spec, settings),
        "vtc-artifact": lambda: VTCPolicy(
            settings,
            name="vtc-artifact",
            lift="artifact",
            ties_to_first_seen=True,
            charge_batch_on_finish=True,
        ),
        "vtc-predict": lambda: VTCPolicy(
            settings, name="vtc-predict", predictor=OutputLengthPredictor()
        ),
        "vtc-oracle": lambda: VTCPolicy(settings, name="vtc-oracle", predictor=OraclePredictor()),
        "vtc-preempt": lambda: VTCPolicy(
            settings,
            name="vtc-preempt",
            preempt_threshold=_number(spec, arg, DEFAULT_PREEMPT_THRESHOLD),
        ),
        "vtc-lpm": lambda: LocalityVTCPolicy(settings, name="vtc-lpm"),
        "vtc-hit": lambda: MissAvoidingVTCPolicy(
            settings, name="vtc-hit", window=_number(spec, arg, DEFAULT_HIT_WINDOW)
        ),
        "dlpm": lambda: DeficitLPMPolicy(
            settings, name="dlpm", quantum=_number(spec, arg, DEFAULT_QUANTUM)
        ),
    }
    builder = builders.get(name)
    if builder is None:
        known = ", ".join(POLICY_HELP)
        raise PolicyError(f"unknown policy {spec!r}; known policies: {known}")
    if arg and name not in ("sjf", "rpm", "vtc-preempt", "vtc-hit", "dlpm"):
        raise PolicyError(f"policy {name!r} takes no argument (got {spec!r})")
    try:
        policy = builder()
    except ValueError as error:
        if isinstance(error, PolicyError):
            raise
        raise PolicyError(f"policy {spec!r}: {error}") from None
    policy.charge_cached_tokens = charge_cached_tokens
    return policy


# The counter policies that share by groups, and their lift rules.
HIERARCHICAL_LIFTS: dict[str, LiftRule] = {"vtc": "paper", "wvtc": "paper", "lcf": "none"}


def _hierarchical(spec: str, name: str, arg: str, settings: PolicySettings) -> Policy:
    lift = HIERARCHICAL_LIFTS.get(name)
    if lift is None:
        raise PolicyError(
            f"policy {spec!r} does not share by groups; with groups use one of "
            f"{', '.join(HIERARCHICAL_LIFTS)}"
        )
    if arg:
        raise PolicyError(f"policy {name!r} takes no argument (got {spec!r})")
    return VTCPolicy(settings, name=name, lift=lift)


def _weighted(spec: str, settings: PolicySettings) -> Policy:
    if not settings.weights:
        raise PolicyError(f"policy {spec!r} needs client weights (--weights FILE)")
    return VTCPolicy(settings, name="wvtc")
