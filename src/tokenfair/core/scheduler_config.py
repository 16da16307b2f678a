"""Scheduler settings: batch and memory limits, admission and preemption modes, and
the paper router's rules (`SchedulerConfig.paper()`, documented in docs/simulator.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

# The paper's runs serve every client through its own rank-8 LoRA adapter (dummy
# weights, also in the runs "without" LoRA); S-LoRA's pool holds 4 x rank per adapter.
PAPER_ADAPTER_TOKENS = 4 * 8
# The paper's runs: a 10,000-token KV pool (SPEC section 5).
PAPER_KV_TOKENS = 10_000


# A pool larger than any block, for checking the other settings before the engine sizes it.
_ANY_POOL = 1 << 40


class ConfigError(ValueError):
    """A scheduler setting that cannot work; the message names the key."""


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    kv_tokens: int = 100_000
    block_size: int = 16
    swap_tokens: int = 0
    admission: Literal["reserve", "optimistic"] = "optimistic"
    preemption: Literal["recompute", "swap"] = "recompute"
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    # With every seat taken, the policy may move a seat from a tenant over its share of
    # the seats to the one waiting (core/contention.py; the VTC family shares by weight),
    # once the head has waited this many steps for a seat: under ordinary churn a seat
    # frees by then, and nobody's work is recomputed for nothing.
    share_seats: bool = True
    seat_patience_steps: int = 4
    # KV memory shared by weight (core/contention.py; the VTC family):
    # a tenant under its share of the pool waiting for memory takes it from the tenant
    # furthest over its share, and the victim of a memory shortage is that tenant's.
    share_memory: bool = True
    # Steps the head waits first in line for memory before someone's is taken for it.
    memory_patience_steps: int = 0
    # While another tenant has work, one tenant's prompt chunks take at most this many
    # tokens of a step (core/step_share.py); None: the step goes to whoever comes first.
    step_share_tokens: int | None = 768
    # The paper's router (see the module docstring); 0 / False / None turn them off.
    admission_interval_steps: int = 0
    # After a failed admission attempt, try again at every step until one admits
    # (the router resets its step count only when it admitted something).
    retry_admission_every_step: bool = False
    separate_prefill: bool = False
    max_prefill_tokens: int | None = None
    charge_first_token: bool = True
    # Reserve admission's peak check, as the paper's router does it: a running request
    # with k outputs holds prompt + k and grows by max_tokens - k - 1 (the last token
    # is sampled, never written to the cache); a request not yet prefilled counts as
    # prompt + 1 growing by max_tokens - 1.
    reserve_peak_excludes_last_token: bool = False
    # Admit only while the estimated peak is strictly below the pool (else: at most it).
    reserve_strictly_below_pool: bool = False
    # Pool tokens each distinct client of the batch (and the candidate's) holds for its
    # LoRA adapter: 4 x rank in S-LoRA's unified pool; counted by reserve admission.
    adapter_tokens_per_client: int = 0

    def __post_init__(self) -> None:
        for key in ("max_num_seqs", "max_batched_tokens", "kv_tokens", "block_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.swap_tokens < 0:
            raise ConfigError(f"swap_tokens must be >= 0, got {self.swap_tokens}")
        if self.kv_tokens < self.block_size:
            raise ConfigError(f"kv_tokens ({self.kv_tokens}) is smaller than one block")
        if self.admission not in ("reserve", "optimistic"):
            raise ConfigError(
                f"admission must be 'reserve' or 'optimistic', got {self.admission!r}"
            )
        if self.preemption not in ("recompute", "swap"):
            raise ConfigError(f"preemption must be 'recompute' or 'swap', got {self.preemption!r}")
        if self.seat_patience_steps < 0:
            raise ConfigError(f"seat_patience_steps must be >= 0, got {self.seat_patience_steps}")
        if self.memory_patience_steps < 0:
            raise ConfigError(
                f"memory_patience_steps must be >= 0, got {self.memory_patience_steps}"
            )
        if self.step_share_tokens is not None and self.step_share_tokens < 1:
            raise ConfigError(
                f"step_share_tokens must be >= 1 or None, got {self.step_share_tokens}"
            )
        if self.admission_interval_steps < 0:
            raise ConfigError("admission_interval_steps must be >= 0")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise ConfigError("max_prefill_tokens must be >= 1 when set")
        if self.adapter_tokens_per_client < 0:
            raise ConfigError("adapter_tokens_per_client must be >= 0")
        if self.admission != "reserve" and (
            self.adapter_tokens_per_client
            or self.reserve_peak_excludes_last_token
            or self.reserve_strictly_below_pool
        ):
            raise ConfigError(
                "adapter_tokens_per_client, reserve_peak_excludes_last_token and "
                "reserve_strictly_below_pool shape the reserve check: they need "
                "admission='reserve'"
            )

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    @property
    def num_swap_blocks(self) -> int:
        return self.swap_tokens // self.block_size

    @classmethod
    def preset(
        cls, name: str, kv_tokens: int | None = None, **overrides: object
    ) -> SchedulerConfig:
        """A named system with `overrides` on top: `paper` (`paper()`, a 10,000-token
        pool by default) or `engine` (vLLM-like: these defaults, `kv_tokens` required,
        prefix caching on unless overridden, as vLLM's). ConfigError names what is wrong."""
        if name == "paper":
            return cls.paper(kv_tokens or PAPER_KV_TOKENS, **overrides)
        if name != "engine":
            raise ConfigError(f"preset {name!r}: expected 'paper' or 'engine'")
        if kv_tokens is None:
            raise ConfigError("the engine preset needs kv_tokens: the KV pool in tokens")
        return cls.from_dict({"kv_tokens": kv_tokens, "enable_prefix_caching": True, **overrides})

    @classmethod
    def paper(cls, kv_tokens: int = PAPER_KV_TOKENS, **overrides: object) -> SchedulerConfig:
        """The S-LoRA/LightLLM router behind the paper's reference numbers (SPEC 5)."""
        settings: dict[str, object] = dict(
            kv_tokens=kv_tokens,
            block_size=1,  # LightLLM allocates KV per token
            admission="reserve",
            max_num_seqs=1000,
            max_batched_tokens=max(kv_tokens // 6, 3072),
            admission_interval_steps=10,
            retry_admission_every_step=True,
            separate_prefill=True,
            max_prefill_tokens=max(kv_tokens // 6, 3072),
            enable_chunked_prefill=False,
            charge_first_token=False,
            reserve_peak_excludes_last_token=True,
            reserve_strictly_below_pool=True,
            adapter_tokens_per_client=PAPER_ADAPTER_TOKENS,
            share_seats=False,  # the router keeps a seat until its request ends
            share_memory=False,  # and its memory (reserve admission never runs short)
            step_share_tokens=None,  # prompts go in steps of their own
        )
        settings.update(overrides)
        return cls(**settings)  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> SchedulerConfig:
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ConfigError(f"unknown scheduler setting {key!r}; known: {sorted(known)}")
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class SchedulerOverrides:
    """The scheduler settings an operator gave, over `SchedulerConfig`'s defaults, for an
    engine whose backend sizes the KV pool (`kv_tokens` is its to choose, so it is not
    one of them). Checked when made: an unknown key or a value the scheduler refuses is
    a `ConfigError` naming it, before any model is loaded."""

    given: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "kv_tokens" in self.given:
            raise ConfigError("kv_tokens is the engine's to size: pass it apart")
        # A copy of its own (a plain dict: the plan travels to the engine's process).
        object.__setattr__(self, "given", dict(self.given))
        self.config(_ANY_POOL)  # the engine's checks, now

    @classmethod
    def of(cls, **given: Any) -> SchedulerOverrides:
        return cls(given)

    def value(self, name: str) -> Any:
        """The setting `name` as the scheduler will have it (given, else its default)."""
        if name in self.given:
            return self.given[name]
        return next(f.default for f in fields(SchedulerConfig) if f.name == name)

    def config(self, kv_tokens: int) -> SchedulerConfig:
        """The scheduler's settings with a KV pool of `kv_tokens`."""
        return SchedulerConfig.from_dict({**self.given, "kv_tokens": kv_tokens})
