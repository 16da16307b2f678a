"""Random mixes of tenants: heavy tenants over their weighted share beside light ones.

The product's promise is that a tenant under its weighted share of every resource (the
seats, the KV blocks, the step's tokens) is not delayed by tenants over theirs, however
many they are and whatever they fill. One workload cannot show that; a family of them
drawn at random can (`benchmarks/any_mix.py`). `random_mix(seed, profile=...)` draws
one, purely from its seed:

- **1-3 heavy tenants** (`heavy-0`, ...): Poisson arrivals of long prompts, each tenant
  with its own prompt range and a few hundred output tokens; together they ask for
  1.5-3x the GPU's time (`request_seconds`), split among them at random, and each
  asks at least 1.5x its weighted share of it. On the A10G profile the prompts lie
  within 1,500-6,000 tokens (the 24,000-token pool holds a few: memory is contended);
  on the H200 profile within 16k-100k tokens (the 900,000-token pool holds many: the
  step is what is contended).
- **2-5 light tenants** (`light-0`, ...): chat-like, Poisson at 0.2-0.8 requests/s on
  the H200 and 0.07-0.28 on the A10G (which serves a tenth as much: at the H200's
  rates most of them asked for more than their weighted share), prompts within
  50-600 tokens and outputs within 50-300, each tenant its own ranges.
- **weights**: half of the mixes give every tenant a weight of 1 to 4 (whole numbers),
  the others weigh all tenants alike;
- **100-120 s of arrivals**.

The `MixSpec` says who is heavy and who is light and with what parameters, so a report
can print it; `Mix.records` are the requests. Each tenant draws its requests from its
own random stream (as the suites' clients do, `generate_workload`), so a light tenant's
requests are the same with or without the others: its traffic alone is the mix's
records of that tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from tokenfair.engine.sim.profile import StepTimeProfile, load_profile
from tokenfair.workloads.arrivals import Poisson
from tokenfair.workloads.client_workload import ClientWorkload
from tokenfair.workloads.lengths import ClientLengths, UniformInt
from tokenfair.workloads.suites import generate_workload
from tokenfair.workloads.trace import TraceRecord

HEAVY_PREFIX = "heavy-"
LIGHT_PREFIX = "light-"
Role = Literal["heavy", "light"]

HEAVY_TENANTS = (1, 3)  # inclusive
LIGHT_TENANTS = (2, 5)
HEAVY_OUTPUT = (100, 400)  # a few hundred tokens
HEAVY_OVERLOAD = (1.5, 3.0)  # the GPU-seconds per second the heavy tenants ask for
HEAVY_OVER_SHARE = 1.5  # each heavy tenant asks at least this times its weighted share
LIGHT_PROMPT = (50, 600)
LIGHT_OUTPUT = (50, 300)
LIGHT_RATE = (0.2, 0.8)  # requests/s
WEIGHTS = (1, 4)  # inclusive, whole numbers
WEIGHTED_PROBABILITY = 0.5
DURATION_S = (100.0, 120.0)
# The A10G serves a tenth of what the H200 does (about 800-1,800 tokens/s of the heavy
# tenants' work): at 0.2-0.8 requests/s the light tenants asked for a median 1.75x
# their weighted share of it (13 of 107 under 0.9 on mixes 0-29), so most were not
# light. At 0.35x those rates (0.07-0.28 requests/s; the same tenants, arrivals further
# apart) the median is 0.71x, 68 of 107 under 0.9, 38 under 0.6, a quarter over 1.1.
A10G_LIGHT_RATE_SCALE = 0.35
# The random stream of a mix's parameters: apart from the tenants' own streams
# ([seed, tenant index], generate_workload), which never reach this index.
_PARAMETER_STREAM = 1_000_003


@dataclass(frozen=True, slots=True)
class MixProfile:
    """A GPU a mix is drawn for: its step-time profile, its KV pool (the engine preset's
    `kv_tokens`), the heavy tenants' prompt bounds, and what the light tenants' rates
    are multiplied by (LIGHT_RATE x `light_rate_scale`)."""

    name: str
    step_profile: str
    kv_tokens: int
    heavy_prompt: tuple[int, int]
    light_rate_scale: float
    description: str


PROFILES: dict[str, MixProfile] = {
    "a10g": MixProfile(
        "a10g",
        "a10g-llama-7b",
        24_000,
        (1_500, 6_000),
        A10G_LIGHT_RATE_SCALE,
        "A10G Llama-2-7B (fitted profile), 24,000-token pool: long prompts wait for memory",
    ),
    "h200": MixProfile(
        "h200",
        "h200-llama-3-8b",
        900_000,
        (16_000, 100_000),
        1.0,
        "H200 Llama-3-8B (roofline), 900,000-token pool: the step is what is contended",
    ),
}


class MixError(ValueError):
    """A mix asked for with a bad seed or profile; the message says what to give."""


@dataclass(frozen=True, slots=True)
class MixTenant:
    """One tenant of a mix: its role, Poisson rate, prompt and output ranges (uniform,
    inclusive), and weight."""

    name: str
    role: Role
    rate: float  # requests/s
    prompt: tuple[int, int]
    output: tuple[int, int]
    weight: float = 1.0

    @property
    def mean_tokens(self) -> float:
        return (sum(self.prompt) + sum(self.output)) / 2

    @property
    def demand_tok_s(self) -> float:
        """Tokens (prompt and output) it asks for per second, on average."""
        return self.rate * self.mean_tokens

    def workload(self) -> ClientWorkload:
        lengths = ClientLengths(UniformInt(*self.prompt), UniformInt(*self.output))
        return ClientWorkload(self.name, Poisson(self.rate), lengths, self.weight)

    def describe(self) -> str:
        weight = f", weight {self.weight:g}" if self.weight != 1.0 else ""
        return (
            f"{self.name}: {self.rate:.3g} req/s, prompts {self.prompt[0]:,}-{self.prompt[1]:,}, "
            f"outputs {self.output[0]}-{self.output[1]}{weight}"
        )


@dataclass(frozen=True, slots=True)
class MixSpec:
    """What a mix is: its seed, GPU profile, arrival span and tenants (heavy first)."""

    seed: int
    profile: str  # a key of PROFILES
    duration_s: float
    tenants: tuple[MixTenant, ...]
    overload: float  # GPU-seconds per second the heavy tenants ask (request_seconds)

    @property
    def heavy(self) -> tuple[MixTenant, ...]:
        return tuple(t for t in self.tenants if t.role == "heavy")

    @property
    def light(self) -> tuple[MixTenant, ...]:
        return tuple(t for t in self.tenants if t.role == "light")

    @property
    def weighted(self) -> bool:
        return any(t.weight != 1.0 for t in self.tenants)

    @property
    def weights(self) -> dict[str, float]:
        return {t.name: t.weight for t in self.tenants}

    def describe(self) -> str:
        weights = "weighted" if self.weighted else "equal weights"
        return (
            f"mix {self.seed} ({self.profile}, {self.duration_s:g} s, {weights}): "
            f"{len(self.heavy)} heavy at {self.overload:.2f}x the GPU "
            f"[{'; '.join(t.describe() for t in self.heavy)}], {len(self.light)} light "
            f"[{'; '.join(t.describe() for t in self.light)}]"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "profile": self.profile,
            "duration_s": self.duration_s,
            "overload": round(self.overload, 3),
            "tenants": [
                {
                    "name": t.name,
                    "role": t.role,
                    "rate": round(t.rate, 4),
                    "prompt": list(t.prompt),
                    "output": list(t.output),
                    "weight": t.weight,
                }
                for t in self.tenants
            ],
        }


@dataclass(frozen=True, slots=True)
class Mix:
    """A drawn mix: its spec and its requests, sorted by arrival."""

    spec: MixSpec
    records: tuple[TraceRecord, ...]

    @property
    def weights(self) -> dict[str, float] | None:
        """The tenants' weights; None when all weigh alike (as the suites say it)."""
        return self.spec.weights if self.spec.weighted else None

    def alone(self, tenant: str) -> tuple[TraceRecord, ...]:
        """`tenant`'s own requests, the same as in the mix, without anyone else's."""
        return tuple(r for r in self.records if r.client == tenant)

    def until(self, duration_s: float) -> Mix:
        """The mix cut to its first `duration_s` seconds of arrivals (for quick runs)."""
        if not duration_s > 0:
            raise MixError(f"a mix's duration must be > 0 s, got {duration_s!r}")
        if duration_s >= self.spec.duration_s:
            return self
        spec = replace(self.spec, duration_s=duration_s)
        return Mix(spec, tuple(r for r in self.records if r.arrival_s < duration_s))


def _range(rng: np.random.Generator, low: int, high: int, min_width: int) -> tuple[int, int]:
    """A random sub-range [a, b] of [low, high], at least `min_width` wide."""
    a = int(rng.integers(low, high - min_width, endpoint=True))
    b = int(rng.integers(a + min_width, high, endpoint=True))
    return a, b


def mix_spec(seed: int, profile: str = "a10g") -> MixSpec:
    """Draw a mix's tenants from `seed` (an integer >= 0) for `profile` (a10g | h200).
    The same seed gives the same tenants, roles, lengths and weights on both profiles;
    the heavy tenants' prompt ranges and rates, and the light tenants' rates (x 0.35
    on the A10G), follow the profile."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise MixError(f"a mix's seed must be a whole number >= 0, got {seed!r}")
    gpu = PROFILES.get(profile)
    if gpu is None:
        raise MixError(f"unknown mix profile {profile!r}; known: {', '.join(PROFILES)}")
    rng = np.random.default_rng([seed, _PARAMETER_STREAM])
    heavy_count = int(rng.integers(*HEAVY_TENANTS, endpoint=True))
    light_count = int(rng.integers(*LIGHT_TENANTS, endpoint=True))
    duration_s = float(round(rng.uniform(*DURATION_S), 1))
    weighted = bool(rng.random() < WEIGHTED_PROBABILITY)
    weights = [
        float(rng.integers(*WEIGHTS, endpoint=True)) if weighted else 1.0
        for _ in range(heavy_count + light_count)
    ]
    # Every draw below happens whatever the profile, so the light tenants are the same
    # on both; the heavy prompt range is drawn as fractions of the profile's bounds.
    overload = float(rng.uniform(*HEAVY_OVERLOAD))
    split = rng.dirichlet(np.ones(heavy_count))
    heavy_shapes = [(rng.random(2), _range(rng, *HEAVY_OUTPUT, 50)) for _ in range(heavy_count)]
    light = [
        MixTenant(
            f"{LIGHT_PREFIX}{i}",
            "light",
            float(round(rng.uniform(*LIGHT_RATE) * gpu.light_rate_scale, 4)),
            _range(rng, *LIGHT_PROMPT, 50),
            _range(rng, *LIGHT_OUTPUT, 50),
            weights[heavy_count + i],
        )
        for i in range(light_count)
    ]
    total_weight = sum(weights)
    low, high = gpu.heavy_prompt
    step_profile = load_profile(gpu.step_profile)
    heavy = []
    for i, ((u, v), output) in enumerate(heavy_shapes):
        width = (high - low) // 10  # a range within [low, high], a tenth of it or wider
        a = low + int(u * (high - low - width))
        prompt = (a, a + width + int(v * (high - a - width)))
        seconds = request_seconds(step_profile, gpu.kv_tokens, prompt, output)
        # GPU-seconds per second: its part of the overload, at least 1.5x its share.
        load = max(split[i] * overload, HEAVY_OVER_SHARE * weights[i] / total_weight)
        rate = float(round(load / seconds, 4))
        heavy.append(MixTenant(f"{HEAVY_PREFIX}{i}", "heavy", rate, prompt, output, weights[i]))
    return MixSpec(
        seed=seed,
        profile=profile,
        duration_s=duration_s,
        tenants=(*heavy, *light),
        overload=sum(
            t.rate * request_seconds(step_profile, gpu.kv_tokens, t.prompt, t.output) for t in heavy
        ),
    )


def request_seconds(
    profile: StepTimeProfile,
    kv_tokens: int,
    prompt: tuple[int, int],
    output: tuple[int, int],
    chunk_tokens: int = 8192,
    seats: int = 256,
) -> float:
    """About how long the GPU spends on one request of this shape (mean prompt P, mean
    output O) while such requests keep it busy under the engine's defaults: its prompt
    in full chunks (P / chunk x a chunk's step), and its share of the decode steps of
    the k requests the pool holds at once (k = pool / (P + O), at most the seats), each
    attending to P + O/2 tokens on average: O x step(k decodes) / k. Decodes riding in
    the prefill steps are not credited, so it is 0-12% above what `fcfs` measures on
    these profiles (1.5k-6k prompts on the A10G, 16k-100k on the H200): a mix's
    overload is at least about 0.9x the figure it states."""
    p, o = sum(prompt) / 2, sum(output) / 2
    k = max(1, min(seats, int(kv_tokens // (p + o))))
    decode = profile.step_time(0, k, int(k * (p + o / 2)))
    return p / chunk_tokens * profile.step_time(chunk_tokens, 0, 0) + o * decode / k


def random_mix(seed: int, profile: str = "a10g") -> Mix:
    """A mix of heavy and light tenants drawn from `seed` for `profile` (a10g | h200):
    its spec and its requests (the module docstring says what it holds)."""
    spec = mix_spec(seed, profile)
    suite = generate_workload(
        [t.workload() for t in spec.tenants], spec.duration_s, seed, f"mix-{seed}"
    )
    return Mix(spec, tuple(suite.records))


def describe_mixes() -> str:
    """One line for `tokenfair trace gen --list`."""
    return (
        f"a random mix (--seed, --profile): {HEAVY_TENANTS[0]}-{HEAVY_TENANTS[1]} heavy tenants "
        f"sending long prompts at {HEAVY_OVERLOAD[0]:g}-{HEAVY_OVERLOAD[1]:g}x the GPU beside "
        f"{LIGHT_TENANTS[0]}-{LIGHT_TENANTS[1]} light chat tenants, weights 1-4 in half of them"
    )
