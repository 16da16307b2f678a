"""What the gateway reads of a chat message: the text of its content (a string, or the
text parts of a list). Token counting (flow/tokens.py) and the prompt-prefix key
(upstreams/prefix.py) read it alike; at the top level, below every room.
"""

from __future__ import annotations

from typing import Any


def text_of(content: Any) -> str:
    """The text of a message's `content`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts count here
        # The upstream validates the parts; a part whose text is not a string counts
        # as nothing here, rather than failing the request.
        texts = (p.get("text") for p in content if isinstance(p, dict))
        return "".join(text for text in texts if isinstance(text, str))
    return ""
