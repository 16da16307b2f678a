"""The `sim:PROFILE` backend's parts (engine/backends.py): serve without a model, at a
profile's step times, in real time.

The simulator's executor decides each step's duration from the step-time profile; here
the step then actually lasts that long on the wall clock (the thread sleeps out the
rest), so clients see tokens at the pace of the profiled GPU. Tokens are placeholders
(each decodes to " tok"); a request generates exactly its max_tokens (the server's
default when the client sends none), since no EOS ever comes.

Profiles: any shipped name or JSON file (`tokenfair profiles`), `zero` (no step time:
measures the server alone), or `fixed:SECONDS` (every step takes SECONDS).

Prompts are not really tokenized, but their ids follow their content: each 4 bytes of
the UTF-8 text are one token (the last group zero-padded), about the count BPE
tokenizers give on English text. So prompts that share a prefix share their leading
ids, and the engine's prefix cache (`--enable-prefix-caching`, salted per tenant) finds
real reuse, as a model's would. Token-id prompts keep their ids.
"""

from __future__ import annotations

import time
from typing import cast

import numpy as np

from tokenfair.core.batch import ExecutorOutput, SchedulerOutput
from tokenfair.engine.sim.executor import SIM_TOKEN, SimExecutor
from tokenfair.engine.sim.profile import LinearStepProfile, StepTimeProfile, load_profile

PLACEHOLDER_TEXT = " tok"
BYTES_PER_TOKEN = 4


def sim_profile(name: str) -> StepTimeProfile:
    """`zero`, `fixed:SECONDS`, a shipped profile name or a JSON file; ValueError otherwise."""
    if name == "zero":
        return cast(
            StepTimeProfile, LinearStepProfile("zero", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "no step time")
        )
    if name.startswith("fixed:"):
        try:
            seconds = float(name.removeprefix("fixed:"))
        except ValueError:
            raise ValueError(
                f"sim profile {name!r}: expected fixed:SECONDS, e.g. fixed:0.01"
            ) from None
        if not 0 <= seconds < 60:
            raise ValueError(f"sim profile {name!r}: step time must be in [0, 60) seconds")
        fixed = LinearStepProfile(name, seconds, 0.0, 0.0, 0.0, 0.0, 0.0, f"{seconds} s per step")
        return cast(StepTimeProfile, fixed)
    try:
        return load_profile(name)
    except ValueError as error:
        raise ValueError(f"sim:{name}: {error}; or zero, or fixed:SECONDS") from None


class WallClockSimExecutor:
    """SimExecutor whose steps take their modelled time on the wall clock."""

    def __init__(self, profile: StepTimeProfile) -> None:
        self.inner = SimExecutor(profile)
        self.profile = profile

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        started = time.monotonic()
        result = self.inner.execute(batch)
        modelled = result.elapsed_s or 0.0
        left = modelled - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
        result.elapsed_s = None  # the engine's wall clock measured the step itself
        return result


class SimTokenizer:
    """Prompt ids from content (4 bytes a token) and placeholder tokens into text."""

    eos_token_ids: frozenset[int] = frozenset()

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")
        if not data:
            return [SIM_TOKEN]  # an empty prompt still counts one token, as before
        padded = data + bytes(-len(data) % BYTES_PER_TOKEN)
        ids: list[int] = np.frombuffer(padded, dtype="<u4").tolist()
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return PLACEHOLDER_TEXT * len(token_ids)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return self.encode(text)


class SimDetokenizer:
    """The engine's Detokenizer for placeholder tokens: one " tok" per new token."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def new_text(self, request_id: str, output_token_ids: list[int]) -> str:
        seen = self._seen.get(request_id, 0)
        self._seen[request_id] = len(output_token_ids)
        return PLACEHOLDER_TEXT * (len(output_token_ids) - seen)

    def forget(self, request_id: str) -> None:
        self._seen.pop(request_id, None)
