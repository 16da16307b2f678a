"""`load_model(spec)`: a model and its tokenizer from "builtin:tiny" or a local directory.

Directories are read with transformers' Auto classes (Llama, Qwen2, Mistral, GPT-2 and
any other causal LM whose attention goes through the cache protocol). Nothing is ever
downloaded: a spec that is not a builtin name or an existing directory is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenfair.engine.hf.builtin import BUILTIN_MODELS, BUILTIN_PREFIX, ByteTokenizer
from tokenfair.engine.hf.tokenizer import HFTokenizer, TextTokenizer


class ModelLoadError(ValueError):
    """The model spec cannot be loaded; the message says what to pass instead."""


@dataclass(slots=True)
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: TextTokenizer | None  # None: token ids in, token ids out, no text


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """None or "auto" keep the model's own dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    if dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    spec: str, device: str | None = None, dtype: str | torch.dtype | None = None
) -> LoadedModel:
    device = device or default_device()
    torch_dtype = parse_dtype(dtype)
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_MODELS:
            raise ModelLoadError(
                f"unknown builtin model {spec!r}; known: builtin:{', builtin:'.join(BUILTIN_MODELS)}"
            )
        model = BUILTIN_MODELS[name](dtype=torch_dtype or torch.float32, device=device)
        return LoadedModel(spec, model, ByteTokenizer())
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ModelLoadError(
            f"model {spec!r} is neither a builtin (builtin:tiny) nor a local directory; "
            "tokenfair never downloads models: pass the path of a transformers model folder"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype or "auto")
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load a causal LM from {path}: {error}") from error
    model = loaded.to(device).eval()
    extra_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return LoadedModel(str(path), model, HFTokenizer(tokenizer, extra_eos))
