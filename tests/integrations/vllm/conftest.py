"""The vLLM plugin's tests run under vLLM's own environment (.venv-vllm), where vLLM's
pins (transformers < 5.20) live apart from tokenfair's main environment.

Under any other interpreter this folder collects nothing: the main suite runs it in
that environment through tests/integrations/test_vllm_env.py, which skips with the
reason when the environment is missing.
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # Before vLLM is imported: no hub, no telemetry, the engine core in this process
    # (the offline tests inspect its scheduler), a small KV cache.
    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }.items():
        os.environ.setdefault(key, value)

    from pathlib import Path

    import pytest

    from tests.integrations.vllm.tiny_model import build

    # Tests that run a model through vLLM (its offline LLM, its OpenAI server).
    MODEL_TESTS = ("test_offline.py", "test_server.py")

    def _why_no_model_runs() -> str | None:
        """None where vLLM can run a model here: its CPU build, or a GPU."""
        import importlib.metadata

        import torch

        try:
            importlib.metadata.distribution("vllm-cpu")
            return None
        except importlib.metadata.PackageNotFoundError:
            pass
        if torch.cuda.is_available():
            return None
        return (
            "vLLM's GPU wheel without a GPU: its scheduler runs here, its model runner "
            "does not (no CPU kernels in that wheel)"
        )

    def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        why = _why_no_model_runs()
        if why is None:
            return
        for item in items:
            if item.path.name in MODEL_TESTS:
                item.add_marker(pytest.mark.skip(reason=why))

    @pytest.fixture(scope="session")
    def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
        """A 2-layer random Llama (hidden 256, vocab 512) with its tokenizer."""
        root = tmp_path_factory.mktemp("tiny-llama")
        os.environ.setdefault("VLLM_CACHE_ROOT", str(root / "vllm-cache"))
        os.environ.setdefault("HF_HOME", str(root / "hf-home"))
        return str(build(Path(root) / "model"))
