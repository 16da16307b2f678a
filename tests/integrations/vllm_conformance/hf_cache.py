"""An offline Hugging Face cache for the model names vLLM's scheduler tests use.

vLLM's scheduler tests build a `ModelConfig` for a few hub models (their config,
and for the multimodal one its processor); they never load weights. There is no hub
here, so this writes, into `HF_HOME/hub`, the snapshot layout the hub client reads in
offline mode: each model's configuration made with transformers' own config classes
(their defaults, set to the shapes those models publish) and a small word-level
tokenizer. Nothing is downloaded.

    python -m tests.integrations.vllm_conformance.hf_cache HF_HOME
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REVISION = "0" * 40  # the snapshot's name: any commit-like string will do


def _tokenizer(vocab_size: int, specials: dict[str, int]) -> Any:
    """A whitespace word-level tokenizer with `vocab_size` ids and the given specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab_size)}
    for token, index in specials.items():
        words.pop(f"w{index}", None)
        words[token] = index
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer, PreTrainedTokenizerFast


def _opt(snapshot: Path) -> None:
    from transformers import OPTConfig

    # OPTConfig's defaults are facebook/opt-125m's shapes.
    config = OPTConfig(architectures=["OPTForCausalLM"], torch_dtype="float16")
    config.save_pretrained(snapshot)
    raw, fast_cls = _tokenizer(config.vocab_size, {"<pad>": 1, "</s>": 2, "<unk>": 3})
    fast_cls(
        tokenizer_object=raw, bos_token="</s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    ).save_pretrained(snapshot)  # fmt: skip


def _llava(snapshot: Path) -> None:
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaProcessor

    # llava-1.5-7b: a Llama-2-7B text model, CLIP ViT-L/14 at 336 px, image token 32000.
    config = LlavaConfig(
        architectures=["LlavaForConditionalGeneration"],
        text_config={"model_type": "llama", "vocab_size": 32064},
        vision_config={
            "model_type": "clip_vision_model",
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "image_size": 336,
            "patch_size": 14,
            "projection_dim": 768,
        },
        image_token_index=32000,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        torch_dtype="float16",
    )
    config.save_pretrained(snapshot)
    specials = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000, "<pad>": 32001}
    raw, fast_cls = _tokenizer(32064, specials)
    tokenizer = fast_cls(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", extra_special_tokens={"image_token": "<image>"},
    )  # fmt: skip
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}
    )
    LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
    ).save_pretrained(snapshot)


def _qwen3_next(snapshot: Path) -> None:
    from transformers import Qwen3NextConfig

    # A hybrid (linear + full attention) model: only its layer layout matters here.
    config = Qwen3NextConfig(architectures=["Qwen3NextForCausalLM"], torch_dtype="bfloat16")
    config.save_pretrained(snapshot)
    raw, fast_cls = _tokenizer(config.vocab_size, {"<unk>": 0, "<|endoftext|>": 1})
    fast_cls(tokenizer_object=raw, eos_token="<|endoftext|>", unk_token="<unk>").save_pretrained(
        snapshot
    )


def _qwen3(snapshot: Path) -> None:
    from transformers import Qwen3Config

    # Qwen3-0.6B's published shapes (vLLM 0.34's tests use it as a plain decoder).
    config = Qwen3Config(
        architectures=["Qwen3ForCausalLM"],
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    config.save_pretrained(snapshot)
    raw, fast_cls = _tokenizer(config.vocab_size, {"<unk>": 0, "<|endoftext|>": 1})
    fast_cls(tokenizer_object=raw, eos_token="<|endoftext|>", unk_token="<unk>").save_pretrained(
        snapshot
    )


MODELS: dict[str, Callable[[Path], None]] = {
    "facebook/opt-125m": _opt,
    "llava-hf/llava-1.5-7b-hf": _llava,
    "Qwen/Qwen3-Next-80B-A3B-Instruct": _qwen3_next,
    "Qwen/Qwen3-0.6B": _qwen3,
}


def build(hf_home: Path) -> Path:
    """Write every model's snapshot under hf_home/hub (afresh); return hf_home."""
    hub = hf_home / "hub"
    for name, write in MODELS.items():
        repo = hub / f"models--{name.replace('/', '--')}"
        snapshot = repo / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        write(snapshot)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
    (hf_home / "tokenfair-models.json").write_text(json.dumps(sorted(MODELS)))
    return hf_home


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_home", type=Path)
    print(build(parser.parse_args().hf_home))


if __name__ == "__main__":
    main()
