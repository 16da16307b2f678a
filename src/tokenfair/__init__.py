"""tokenfair: fair-share scheduling for multi-tenant LLM inference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tokenfair.llm import LLM


def __getattr__(name: str) -> Any:
    # The offline LLM API pulls in torch: import it only when asked for, so the core,
    # simulator and CLI stay light.
    if name == "LLM":
        from tokenfair.llm import LLM

        return LLM
    raise AttributeError(f"module 'tokenfair' has no attribute {name!r}")


__all__ = ["LLM", "__version__"]
