"""What the server serves: an Engine plus the tokenizer and limits around it.

`build_served_model(spec, ...)` makes one from `builtin:tiny`, a local transformers
model directory (the HF executor) or `sim:PROFILE` (the simulator's executor on the wall
clock); the scheduler is the same in all three. The policy gets the tenants' weights.

`build_engine_and_card(...)` is the same build for an engine in its own process
(engine/engine_process.py): it runs there, keeps the Engine and sends the server the
ServedModel without it (the card: tokenizer, limits, KV geometry, policy name).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.registry import make_policy
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.core.share_tree import ShareTree
from tokenfair.engine.engine import Engine
from tokenfair.server.sim_model import (
    SIM_PREFIX,
    SimDetokenizer,
    SimTokenizer,
    WallClockSimExecutor,
    sim_profile,
)

# sim: has no position limit of its own; the KV pool and the tenant bound apply.
SIM_MAX_CONTEXT = 1 << 30


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
    **scheduler_options: Any,
) -> ServedModel:
    """Load `spec` and build its engine; ValueError (one line) for anything wrong."""
    chosen = build_policy(policy, weights or {}, charge_cached_tokens, tree)
    name = served_name or spec
    if spec.startswith(SIM_PREFIX):
        profile = sim_profile(spec.removeprefix(SIM_PREFIX))
        config = SchedulerConfig.from_dict(
            {**scheduler_options, "kv_tokens": kv_tokens if kv_tokens is not None else 1_000_000}
        )
        engine = Engine(
            Scheduler(config, chosen),
            WallClockSimExecutor(profile),
            detokenizer=SimDetokenizer(),
        )
        return ServedModel(
            name=name,
            tokenizer=SimTokenizer(),
            max_context=SIM_MAX_CONTEXT,
            vocab_size=None,
            has_chat_template=True,
            keeps_token_ids=True,  # content-derived ids: its prefix cache sees real reuse
            is_sim=True,
            **_engine_facts(engine),
        )
    try:
        from tokenfair.engine.hf.builtin import BUILTIN_KV_TOKENS, BUILTIN_PREFIX
        from tokenfair.engine.hf.factory import make_hf_engine
        from tokenfair.engine.hf.loader import load_model
    except ImportError as error:
        raise ValueError(
            f"real models need the model extra: pip install 'tokenfair[model]' ({error})"
        ) from None
    loaded = load_model(spec, device, dtype)
    if kv_tokens is None and spec.startswith(BUILTIN_PREFIX):
        kv_tokens = BUILTIN_KV_TOKENS
    if loaded.tokenizer is None:
        raise ValueError(f"model {spec!r} has no tokenizer: the server needs one for text")
    built = make_hf_engine(
        loaded, policy="fcfs", kv_tokens=kv_tokens, seed=seed, **scheduler_options
    )
    # Same config and executor, our policy (it carries the tenants' weights).
    engine = Engine(
        Scheduler(built.scheduler.config, chosen), built.executor, detokenizer=built.detokenizer
    )
    model_config: Any = getattr(loaded.model, "config", None)
    text_config = model_config.get_text_config()
    max_positions = int(getattr(text_config, "max_position_embeddings", 0) or 0)
    inner = getattr(loaded.tokenizer, "inner", None)
    has_template = inner is None or getattr(inner, "chat_template", None) is not None
    vocab = getattr(text_config, "vocab_size", None)
    return ServedModel(
        name=name,
        tokenizer=loaded.tokenizer,
        max_context=max_positions or engine.scheduler.config.kv_tokens,
        vocab_size=int(vocab) if vocab else None,
        has_chat_template=has_template,
        keeps_token_ids=True,
        is_sim=False,
        **_engine_facts(engine),
    )


def _engine_facts(engine: Engine) -> dict[str, Any]:
    kv = engine.scheduler.kv
    return {
        "kv_num_blocks": kv.num_blocks,
        "kv_block_size": kv.block_size,
        "policy_name": engine.scheduler.policy.name,
        "engine": engine,
    }


def build_engine_and_card(spec: str, **options: Any) -> tuple[ServedModel, Engine]:
    """`build_served_model` in an engine process: the card for the server, the engine
    for the process."""
    served = build_served_model(spec, **options)
    assert served.engine is not None
    return served.card(), served.engine
