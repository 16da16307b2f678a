"""The engine backends, chosen by the model spec: the one place that knows what serves a
model.

- `sim:PROFILE`: the simulator's executor on the wall clock (engine/sim/wall_clock.py):
  no model, placeholder tokens at a profile's step times;
- `builtin:NAME` or a local transformers model directory: the transformers executor
  (engine/hf/), behind the `model` extra.

Each builds an `Engine` around the policy it is given (the deployment's, with the
tenants' weights) and says what the server must know of the model (`BuiltModel`). The
server and the commands ask `backend_for(spec)`, never the spec's prefix. Nothing heavy
is imported until `build` runs: the commands ask a backend what it needs (an extra, a
device) before checking that it is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tokenfair.core.policies.base import Policy
from tokenfair.core.scheduler_config import SchedulerOverrides
from tokenfair.engine.engine import Engine

SIM_PREFIX = "sim:"
# sim: has no position limit of its own; the KV pool and the tenant bound apply.
SIM_MAX_CONTEXT = 1 << 30
SIM_KV_TOKENS = 1_000_000


@dataclass(slots=True)
class BuiltModel:
    """An engine and what the server needs to know of its model."""

    engine: Engine
    tokenizer: Any  # encode, decode, chat_prompt, eos_token_ids (server/model.py)
    max_context: int  # positions the model can attend to (prompt + output)
    vocab_size: int | None  # None: any token id is fine (sim)
    has_chat_template: bool
    keeps_token_ids: bool  # the engine request carries the prompt's ids (prefix caching)
    is_sim: bool


# `--decode-kernel`'s names, and what each asks of the engine: a kernel reading the KV
# pool in place ("c" on the CPU, "triton" on a GPU), or none (gathers and SDPA).
DECODE_KERNELS: dict[str, Literal["c", "triton", False]] = {
    "c": "c",
    "triton": "triton",
    "torch": False,
}


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """What the server asks of the engine it builds."""

    kv_tokens: int | None = None  # the KV pool (None: the backend's default)
    device: str | None = None  # transformers only
    dtype: str | None = None  # transformers only
    seed: int = 0
    scheduler: SchedulerOverrides = field(default_factory=SchedulerOverrides)
    # transformers only: the decodes' attention, "c" or "triton" (a kernel reading the
    # pool in place), "torch" (gathers and SDPA), None the engine's choice
    decode_kernel: str | None = None


@dataclass(frozen=True, slots=True)
class Backend:
    """What serves a model spec, and what the commands must know before building it."""

    name: str  # as `--engine auto` and the errors say it
    # Where `tokenfair serve --engine auto` steps it: a real model in a process of its
    # own (its Python never waits for the event loop's GIL), sim: in a thread (it only
    # sleeps through its steps; a hop to another process would cost it latency).
    engine_mode: Literal["thread", "process"]
    extra: str | None  # the install extra it needs
    takes_device: bool  # --device and --dtype apply to it
    builder: Callable[[str, Policy, BuildOptions], BuiltModel]

    def build(
        self,
        spec: str,
        policy: Policy,
        *,
        kv_tokens: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
        seed: int = 0,
        decode_kernel: str | None = None,
        **scheduler_options: Any,
    ) -> BuiltModel:
        """Load `spec` and build its engine; ValueError (one line) for anything wrong."""
        scheduler = SchedulerOverrides(scheduler_options)
        options = BuildOptions(kv_tokens, device, dtype, seed, scheduler, decode_kernel)
        return self.builder(spec, policy, options)


def _build_sim(spec: str, policy: Policy, options: BuildOptions) -> BuiltModel:
    from tokenfair.core.scheduler import Scheduler
    from tokenfair.engine.sim.wall_clock import (
        SimDetokenizer,
        SimTokenizer,
        WallClockSimExecutor,
        sim_profile,
    )

    profile = sim_profile(spec.removeprefix(SIM_PREFIX))
    pool = options.kv_tokens if options.kv_tokens is not None else SIM_KV_TOKENS
    engine = Engine(
        Scheduler(options.scheduler.config(pool), policy),
        WallClockSimExecutor(profile),
        detokenizer=SimDetokenizer(),
    )
    return BuiltModel(
        engine=engine,
        tokenizer=SimTokenizer(),
        max_context=SIM_MAX_CONTEXT,
        vocab_size=None,
        has_chat_template=True,
        keeps_token_ids=True,  # content-derived ids: its prefix cache sees real reuse
        is_sim=True,
    )


def _build_transformers(spec: str, policy: Policy, options: BuildOptions) -> BuiltModel:
    try:
        from tokenfair.engine.hf.builtin import BUILTIN_KV_TOKENS, BUILTIN_PREFIX
        from tokenfair.engine.hf.factory import make_hf_engine
        from tokenfair.engine.hf.loader import load_model
    except ImportError as error:
        raise ValueError(
            f"real models need the model extra: pip install 'tokenfair[model]' ({error})"
        ) from None
    loaded = load_model(spec, options.device, options.dtype)
    kv_tokens = options.kv_tokens
    if kv_tokens is None and spec.startswith(BUILTIN_PREFIX):
        kv_tokens = BUILTIN_KV_TOKENS
    if loaded.tokenizer is None:
        raise ValueError(f"model {spec!r} has no tokenizer: the server needs one for text")
    kernel = DECODE_KERNELS[options.decode_kernel] if options.decode_kernel else None
    engine = make_hf_engine(
        loaded,
        policy=policy,
        kv_tokens=kv_tokens,
        seed=options.seed,
        decode_kernel=kernel,
        **options.scheduler.given,
    )
    model_config: Any = getattr(loaded.model, "config", None)
    text_config = model_config.get_text_config()
    max_positions = int(getattr(text_config, "max_position_embeddings", 0) or 0)
    inner = getattr(loaded.tokenizer, "inner", None)
    vocab = getattr(text_config, "vocab_size", None)
    return BuiltModel(
        engine=engine,
        tokenizer=loaded.tokenizer,
        max_context=max_positions or engine.scheduler.config.kv_tokens,
        vocab_size=int(vocab) if vocab else None,
        has_chat_template=inner is None or getattr(inner, "chat_template", None) is not None,
        keeps_token_ids=True,
        is_sim=False,
    )


SIM = Backend("sim", "thread", extra=None, takes_device=False, builder=_build_sim)
TRANSFORMERS = Backend(
    "transformers", "process", extra="model", takes_device=True, builder=_build_transformers
)

# Model spec prefix -> its backend; a spec with none of them (a directory, `builtin:`)
# is a transformers model. A new backend is a `Backend` above and a line here.
BACKENDS_BY_PREFIX: dict[str, Backend] = {SIM_PREFIX: SIM}


def backend_for(spec: str) -> Backend:
    """The backend a model spec names."""
    for prefix, backend in BACKENDS_BY_PREFIX.items():
        if spec.startswith(prefix):
            return backend
    return TRANSFORMERS
