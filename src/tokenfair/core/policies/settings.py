"""What every policy is built with, apart from its own arguments.

A policy named by `module:Class` (or installed under the `tokenfair.policies` entry
point group) is constructed as `Class(settings, **arguments)`: `settings` carries what
the operator configured for the deployment as a whole (tenant weights, the share tree
of groups, the cost of a token, what a cached prompt token costs), the keyword
arguments come from the spec (`mypkg.mod:MyPolicy(half_life=30)`).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field

from tokenfair.core.cost import DEFAULT_COST, CostFunction
from tokenfair.core.share_tree import ShareTree
from tokenfair.core.weights import check_weight


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """The deployment's settings a policy may use.

    `weights`: node id -> weight (clients, and groups as `@path`), 1 when absent, each
    from 0.01 to 100 (core/weights.py: ValueError otherwise). The mapping is shared,
    not copied: an operator's weight change at run time (the admin API) is seen by the
    policy at its next decision.
    `cost`: the price of prompt and output tokens (core/cost.py).
    `tree`: the groups clients belong to; a tree with no group is the flat case.
    `charge_cached_tokens`: what a prompt token served from the prefix cache costs, as
    a share of a computed one (1: the prompt as sent, the paper's cost; 0: only the
    tokens computed).
    """

    weights: MutableMapping[str, float] = field(default_factory=dict)
    cost: CostFunction = DEFAULT_COST
    tree: ShareTree = field(default_factory=ShareTree)
    charge_cached_tokens: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.charge_cached_tokens <= 1.0:
            raise ValueError(
                f"charge_cached_tokens must be between 0 and 1, got {self.charge_cached_tokens}"
            )
        for node, weight in self.weights.items():
            check_weight(weight, f"weight of {node!r}")
