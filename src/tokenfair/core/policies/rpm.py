"""FCFS plus a per-client request-rate limit (the industry's blunt fairness fix).

At most `limit` requests per client are accepted in any sliding `window_s` seconds; the
rest are rejected at arrival (HTTP 429 in servers). It rejects work even when the
deployment is idle: that is the point of comparing against it.
"""

from __future__ import annotations

from tokenfair.core.policies.declaration import Argument, Declared, Needs
from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.core.policies.view import RequestView
from tokenfair.core.rate_window import RateWindow


class RPMPolicy(FCFSPolicy):
    def __init__(self, limit: int, window_s: float = 60.0):
        super().__init__()
        self.window = RateWindow(limit, window_s)
        self.limit = limit
        self.window_s = window_s
        self.name = f"rpm:{limit}"

    def accept(self, request: RequestView, now: float) -> bool:
        return self.window.accept(request.client, now)

    def retry_after(self, client: str, now: float) -> float:
        """Seconds until `client` may be accepted again (0 when it may now)."""
        return self.window.retry_after(client, now)


DECLARED = [
    Declared(
        "rpm",
        "FCFS plus at most N accepted requests per client per sliding 60 s",
        lambda settings, limit: RPMPolicy(limit=int(limit)),
        argument=Argument("limit", None, unit="requests per minute"),
        needs=Needs(per_replica=True, vllm=False),
    )
]
