"""What the server serves: an Engine plus the tokenizer and limits around it.

`build_served_model(spec, ...)` makes one with the backend the spec names
(engine/backends.py: `builtin:tiny` or a local transformers model directory, the HF
executor; `sim:PROFILE`, the simulator's executor on the wall clock); the scheduler is
the same in all. The policy gets the tenants' weights.

`build_engine_and_card(...)` is the same build for an engine in its own process
(engine/engine_process.py): it runs there, keeps the Engine and sends the server the
ServedModel without it (the card: tokenizer, limits, KV geometry, policy name).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.registry import make_policy
from tokenfair.core.scheduler_config import SchedulerOverrides
from tokenfair.core.share_tree import ShareTree
from tokenfair.engine.backends import BuildOptions, backend_for
from tokenfair.engine.engine import Engine
from tokenfair.engine.policy_guard import GuardedPolicy


class ModelTokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]: ...


class NoChatTemplateError(ValueError):
    """The model directory has no chat template: /v1/chat/completions cannot render."""


@dataclass(slots=True)
class ServedModel:
    name: str  # the model id clients send and /v1/models lists
    tokenizer: ModelTokenizer
    max_context: int  # positions the model can attend to (prompt + output)
    vocab_size: int | None  # None: any token id is fine (sim)
    has_chat_template: bool
    keeps_token_ids: bool  # the engine request carries the prompt's ids (prefix caching)
    is_sim: bool
    kv_num_blocks: int
    kv_block_size: int
    policy_name: str
    # The engine, where it steps in this process; None on a card whose engine runs in
    # a process of its own.
    engine: Engine | None = None

    @property
    def kv_tokens(self) -> int:
        return self.kv_num_blocks * self.kv_block_size

    def card(self) -> ServedModel:
        """The same model without its engine (what another process needs to serve it)."""
        return replace(self, engine=None)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        if not self.has_chat_template:
            raise NoChatTemplateError(
                f"model {self.name!r} has no chat template (tokenizer_config.json has no "
                "chat_template): use /v1/completions with a prompt instead"
            )
        return self.tokenizer.chat_prompt(messages)


def build_policy(
    spec: str,
    weights: dict[str, float],
    charge_cached_tokens: float = 1.0,
    tree: ShareTree | None = None,
) -> Policy:
    """The policy with the tenants' weights and, with groups, their tree (hierarchical
    VTC: `weights` then names groups as `@path` too)."""
    return make_policy(
        spec, weights=weights or None, charge_cached_tokens=charge_cached_tokens, tree=tree
    )


@dataclass(frozen=True, slots=True)
class ModelPlan:
    """What the server builds: the model spec, the policy with the tenants' shares, and
    the engine's options. Typed and picklable: an engine process builds it too."""

    spec: str  # builtin:NAME, a model directory, sim:PROFILE (engine/backends.py)
    policy: str = "vtc"
    weights: dict[str, float] = field(default_factory=dict)  # tenants, groups as @path
    tree: ShareTree | None = None
    served_name: str | None = None  # the model id clients send (default: the spec)
    charge_cached_tokens: float = 1.0
    build: BuildOptions = field(default_factory=BuildOptions)

    def served_model(self) -> ServedModel:
        """Load the model and build its engine; ValueError (one line) for anything wrong."""
        chosen = build_policy(self.policy, self.weights, self.charge_cached_tokens, self.tree)
        # A hook that raises switches the server to fcfs instead of ending its engine.
        chosen = GuardedPolicy(chosen)
        built = backend_for(self.spec).builder(self.spec, chosen, self.build)
        return ServedModel(
            name=self.served_name or self.spec,
            tokenizer=built.tokenizer,
            max_context=built.max_context,
            vocab_size=built.vocab_size,
            has_chat_template=built.has_chat_template,
            keeps_token_ids=built.keeps_token_ids,
            is_sim=built.is_sim,
            **_engine_facts(built.engine),
        )


def build_served_model(
    spec: str,
    *,
    policy: str = "vtc",
    weights: dict[str, float] | None = None,
    tree: ShareTree | None = None,
    served_name: str | None = None,
    kv_tokens: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
    charge_cached_tokens: float = 1.0,
    decode_kernel: str | None = None,
    **scheduler_options: Any,
) -> ServedModel:
    """`ModelPlan(...).served_model()`, the options given as keywords."""
    scheduler = SchedulerOverrides(scheduler_options)
    options = BuildOptions(kv_tokens, device, dtype, seed, scheduler, decode_kernel)
    plan = ModelPlan(spec, policy, weights or {}, tree, served_name, charge_cached_tokens, options)
    return plan.served_model()


def _engine_facts(engine: Engine) -> dict[str, Any]:
    kv = engine.scheduler.kv
    return {
        "kv_num_blocks": kv.num_blocks,
        "kv_block_size": kv.block_size,
        "policy_name": engine.scheduler.policy.name,
        "engine": engine,
    }


def build_engine_and_card(
    plan: ModelPlan | None = None, **options: Any
) -> tuple[ServedModel, Engine]:
    """The plan (or `build_served_model`'s keywords) built in an engine process: the card
    for the server, the engine for the process."""
    served = plan.served_model() if plan is not None else build_served_model(**options)
    assert served.engine is not None
    return served.card(), served.engine
