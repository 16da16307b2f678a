from __future__ import annotations

import pytest

FAMILIES = ("llama", "qwen2", "gpt2")


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    """A transformers model family the engine must match token for token."""
    return request.param
