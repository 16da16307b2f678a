"""builtin:tiny, the byte tokenizer, the detokenizer, KV sizing and load errors."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model

torch = pytest.importorskip("torch")

from tokenfair.engine.hf.builtin import ByteTokenizer, build_tiny  # noqa: E402
from tokenfair.engine.hf.kv_pool import KVPool, KVShape, kv_bytes_per_token  # noqa: E402
from tokenfair.engine.hf.loader import ModelLoadError, load_model  # noqa: E402
from tokenfair.engine.hf.tokenizer import IncrementalDetokenizer  # noqa: E402


def test_builtin_tiny_is_deterministic():
    a, b = build_tiny(), build_tiny()
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y), name


def test_byte_tokenizer_round_trip_and_chat_template():
    tok = ByteTokenizer()
    text = "héllo wörld €"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.chat_prompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert ids[0] == 256 and ids[-1] == tok.encode("<|assistant|>")[0]
    assert tok.decode(ids) == "be briefhi"
    with pytest.raises(ValueError, match="role"):
        tok.chat_prompt([{"role": "robot", "content": "x"}])


def test_incremental_detokenizer_waits_for_whole_characters():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    ids = tok.encode("a€b漢字 ok")
    pieces = [detok.new_text("r", ids[: i + 1]) for i in range(len(ids))]
    assert "".join(pieces) == "a€b漢字 ok"
    assert all("\ufffd" not in p for p in pieces)
    detok.forget("r")


def test_kv_bytes_per_token_matches_the_spec_formula():
    from transformers import LlamaConfig

    llama8b = LlamaConfig(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8
    )
    assert kv_bytes_per_token(llama8b, torch.bfloat16) == 128 * 1024  # SPEC 5: 128 KiB/token


def test_swap_copies_blocks_out_and_back():
    shape = KVShape(num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32)
    pool = KVPool(shape, num_blocks=4, block_size=2, device="cpu", num_swap_blocks=2)
    pool.data.normal_()
    before = pool.data[:, :, :, [1, 3]].clone()
    pool.swap_out([(1, 0), (3, 1)])
    pool.data.zero_()
    pool.swap_in([(1, 2), (0, 0)])
    assert torch.equal(pool.data[:, :, :, 2], before[:, :, :, 1])  # device 3 -> swap 1 -> device 2
    assert torch.equal(pool.data[:, :, :, 0], before[:, :, :, 0])  # device 1 -> swap 0 -> device 0


def test_load_model_errors_say_what_to_do(tmp_path):
    with pytest.raises(ModelLoadError, match="builtin:tiny"):
        load_model("builtin:huge")
    with pytest.raises(ModelLoadError, match="never downloads"):
        load_model("meta-llama/Llama-2-7b-hf")
    with pytest.raises(ModelLoadError, match="cannot load"):
        load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model("builtin:tiny", dtype="int3")


def test_load_model_from_a_saved_directory(tmp_path):
    """A local transformers directory (model + tokenizer) loads and generates."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {chr(c): i for i, c in enumerate(range(97, 123))} | {"<eos>": 26}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=27, n_embd=32, n_layer=1, n_head=2, eos_token_id=26, bos_token_id=26)
    )
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    from tokenfair.core.request import SamplingParams
    from tokenfair.llm import LLM

    llm = LLM(str(tmp_path), device="cpu", dtype="float32", kv_tokens=512)
    completion = llm.generate("abc", SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert completion.prompt_token_ids == [0, 1, 2]
    assert len(completion.token_ids) == 5
    assert llm.loaded.tokenizer.eos_token_ids == frozenset({26})


def test_the_builtin_model_gets_a_small_pool_unless_asked():
    from tokenfair.engine.hf.builtin import BUILTIN_KV_TOKENS
    from tokenfair.server.model import build_served_model

    served = build_served_model("builtin:tiny", device="cpu")
    assert served.engine is not None
    assert served.engine.scheduler.config.kv_tokens == BUILTIN_KV_TOKENS
    asked = build_served_model("builtin:tiny", device="cpu", kv_tokens=4096)
    assert asked.engine is not None and asked.engine.scheduler.config.kv_tokens == 4096


def test_a_pool_sized_from_memory_holds_no_more_than_every_sequence_at_full_context():
    from tokenfair.engine.hf.factory import kv_tokens_for_memory, make_hf_engine

    loaded = load_model("builtin:tiny", "cpu", None)
    loaded.model.config.max_position_embeddings = 100  # 7 blocks of 16
    by_memory = kv_tokens_for_memory(loaded.model, 16)
    engine = make_hf_engine(loaded, max_num_seqs=4, block_size=16)
    assert engine.scheduler.config.kv_tokens == min(by_memory, 4 * 7 * 16)


def test_a_cpu_engine_takes_longer_kv_blocks_unless_told():
    from tokenfair.engine.hf.factory import DEFAULT_CPU_BLOCK_SIZE, make_hf_engine

    loaded = load_model("builtin:tiny", "cpu", None)
    assert make_hf_engine(loaded, kv_tokens=1024).scheduler.config.block_size == 64
    assert DEFAULT_CPU_BLOCK_SIZE == 64
    told = make_hf_engine(loaded, kv_tokens=1024, block_size=16)
    assert told.scheduler.config.block_size == told.executor.block_size == 16
