"""Step-time profiles: how long one engine step takes, as a function of its batch.

A step is described by three numbers: prefill tokens (prompt tokens computed), decode
requests (requests computing one token), and context tokens (the KV the decoding
requests attend to). Two kinds of profile:

- `LinearStepProfile`, fitted to measurements (the paper's A10G timings, or
  `tokenfair profile` on this machine):
      t = base + overhead + [prefill > 0] * prefill_base + prefill_token * P
            + decode_request * D + context_token * C
  where `overhead` (0 unless calibrated) is fitted to a measured run's timings.
- `RooflineStepProfile`, derived from model shape and GPU specs (docs/profiles.md):
  a step is bound by whichever is slower, reading weights + KV from memory or doing
  the math, plus a fixed launch overhead.

Swap copies add `swap_token_s` per token moved.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol


class StepTimeProfile(Protocol):
    # Read-only, so frozen dataclasses (and a computed property) satisfy it.
    @property
    def name(self) -> str: ...

    @property
    def swap_token_s(self) -> float: ...

    def step_time(
        self, prefill_tokens: int, decode_requests: int, context_tokens: int
    ) -> float: ...

    def to_json(self) -> dict: ...


@dataclass(frozen=True, slots=True)
class LinearStepProfile:
    name: str
    base_s: float
    prefill_base_s: float
    prefill_token_s: float
    decode_request_s: float
    context_token_s: float
    swap_token_s: float = 0.0
    description: str = ""
    # Added to every step: overhead the fitted measurements do not show, calibrated on
    # a measured run (engine/sim/calibration.py); kept apart from base_s so the fit
    # and the calibration stay separately visible.
    step_overhead_s: float = 0.0

    def step_time(self, prefill_tokens: int, decode_requests: int, context_tokens: int) -> float:
        t = self.base_s + self.step_overhead_s + self.prefill_token_s * prefill_tokens
        if prefill_tokens:
            t += self.prefill_base_s
        return t + self.decode_request_s * decode_requests + self.context_token_s * context_tokens

    def to_json(self) -> dict:
        return {"kind": "linear", **asdict(self)}


@dataclass(frozen=True, slots=True)
class RooflineStepProfile:
    """A step is max(memory time, compute time) + overhead (docs/profiles.md)."""

    name: str
    params: float  # model parameters
    weight_bytes: float  # bytes of weights read every step
    kv_bytes_per_token: float  # 2 x layers x kv_heads x head_dim x dtype bytes
    hbm_bytes_per_s: float
    flops_per_s: float  # dense peak for the dtype
    bandwidth_efficiency: float = 0.8
    compute_efficiency: float = 0.6
    overhead_s: float = 0.004
    swap_bytes_per_s: float = 25e9
    description: str = ""

    @property
    def swap_token_s(self) -> float:
        return self.kv_bytes_per_token / self.swap_bytes_per_s

    def step_time(self, prefill_tokens: int, decode_requests: int, context_tokens: int) -> float:
        tokens = prefill_tokens + decode_requests
        memory_bytes = self.weight_bytes + self.kv_bytes_per_token * (context_tokens + tokens)
        memory_s = memory_bytes / (self.hbm_bytes_per_s * self.bandwidth_efficiency)
        compute_s = 2.0 * self.params * tokens / (self.flops_per_s * self.compute_efficiency)
        return self.overhead_s + max(memory_s, compute_s)

    def to_json(self) -> dict:
        return {"kind": "roofline", **asdict(self)}


def fit_linear_profile(
    samples: list[tuple[int, int, int, float]],
    name: str,
    description: str = "",
    swap_token_s: float = 0.0,
) -> LinearStepProfile:
    """Least-squares fit of the linear form to (prefill, decode, context, seconds) samples.

    Every coefficient is a time and must be >= 0: a term that comes out negative is
    dropped and the rest refitted without it (an active-set non-negative fit), rather
    than clipped after the fact, which would leave the others fitted for a term that
    is not there.
    """
    import numpy as np

    rows = [(1.0, 1.0 if p else 0.0, p, d, c) for p, d, c, _ in samples]
    design = np.array(rows, dtype=float)
    seconds = np.array([s for *_, s in samples], dtype=float)
    # Columns that never vary cannot be fitted (the constant aside): leave them at zero.
    active = [j for j in range(design.shape[1]) if j == 0 or np.ptp(design[:, j]) > 0]
    coef = np.zeros(design.shape[1])
    while active:
        solution, *_ = np.linalg.lstsq(design[:, active], seconds, rcond=None)
        if (solution >= 0).all():
            coef[active] = solution
            break
        del active[int(np.argmin(solution))]
    base, prefill_base, prefill_token, decode_request, context_token = (float(x) for x in coef)
    return LinearStepProfile(
        name,
        base,
        prefill_base,
        prefill_token,
        decode_request,
        context_token,
        swap_token_s,
        description,
    )


def samples_from_cost_profile(grid: dict) -> list[tuple[int, int, int, float]]:
    """Turn the paper's `{input: {output: [batch, prefill_s, decode_s]}}` timings into samples.

    prefill_s and decode_s are per-request shares of the batch's times: the batch's
    prefill took prefill_s x batch; one decode step took decode_s x batch / output_len
    and attended to batch x (input + output/2) context tokens on average.
    """
    samples = []
    for input_len, by_output in grid.items():
        for output_len, (batch, prefill_s, decode_s) in by_output.items():
            x, y, b = int(input_len), int(output_len), int(batch)
            samples.append((x * b, 0, 0, prefill_s * b))
            samples.append((0, b, int(b * (x + y / 2)), decode_s * b / y))
    return samples


def profile_from_json(data: dict) -> StepTimeProfile:
    data = dict(data)
    kind = data.pop("kind", "linear")
    if kind == "linear":
        return LinearStepProfile(**data)
    if kind == "roofline":
        return RooflineStepProfile(**data)
    raise ValueError(f"unknown profile kind {kind!r}: expected 'linear' or 'roofline'")


def builtin_profiles() -> list[str]:
    folder = resources.files("tokenfair.engine.sim") / "profiles"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_profile(name_or_path: str) -> StepTimeProfile:
    """A shipped profile by name (e.g. `a10g-llama-7b`) or a JSON file path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return profile_from_json(json.loads(path.read_text()))
    shipped = resources.files("tokenfair.engine.sim") / "profiles" / f"{name_or_path}.json"
    if not shipped.is_file():
        raise ValueError(
            f"unknown profile {name_or_path!r}: use a JSON file or one of {', '.join(builtin_profiles())}"
        )
    return profile_from_json(json.loads(shipped.read_text()))


def save_profile(profile: StepTimeProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_json(), indent=2) + "\n")
