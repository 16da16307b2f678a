from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.registry import POLICY_HELP, PolicyError, make_policy

__all__ = ["POLICY_HELP", "Policy", "PolicyError", "make_policy"]
