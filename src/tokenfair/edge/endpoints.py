"""The OpenAI endpoints that generate, which the server and the gateway both serve on a
fast path of their own (a raw ASGI handler in front of the web framework)."""

from __future__ import annotations

COMPLETION_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
