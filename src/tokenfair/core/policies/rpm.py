"""FCFS plus a per-client request-rate limit (the industry's blunt fairness fix).

At most `limit` requests per client are accepted in any sliding `window_s` seconds; the
rest are rejected at arrival (HTTP 429 in servers). It rejects work even when the
deployment is idle: that is the point of comparing against it.
"""

from __future__ import annotations

from collections import deque

from tokenfair.core.policies.fcfs import FCFSPolicy
from tokenfair.core.request import Request


class RPMPolicy(FCFSPolicy):
    def __init__(self, limit: int, window_s: float = 60.0):
        super().__init__()
        if limit < 1:
            raise ValueError(f"rpm limit must be >= 1 request per window, got {limit}")
        self.limit = limit
        self.window_s = window_s
        self.name = f"rpm:{limit}"
        self._accepted: dict[str, deque[float]] = {}

    def accept(self, request: Request, now: float) -> bool:
        times = self._accepted.setdefault(request.client, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.limit:
            return False
        times.append(now)
        return True

    def retry_after(self, client: str, now: float) -> float:
        """Seconds until `client` may be accepted again (0 when it may now)."""
        times = self._accepted.get(client)
        if not times or len(times) < self.limit:
            return 0.0
        return max(0.0, times[0] + self.window_s - now)

    def unaccept(self, client: str) -> None:
        """Take back the latest acceptance of `client`: its request was refused later
        on (a full queue), so it used no place in the window."""
        times = self._accepted.get(client)
        if times:
            times.pop()
