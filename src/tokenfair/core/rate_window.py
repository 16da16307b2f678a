"""A sliding-window request count per client: the one rpm limit of the whole package.

At most `limit` acceptances per client in any `window_s` seconds; `rpm:N` (the policy),
the server's and the gateway's tenant `rpm` all count with it. Time is passed in.
"""

from __future__ import annotations

from collections import deque


class RateWindow:
    __slots__ = ("_accepted", "limit", "window_s")

    def __init__(self, limit: int, window_s: float = 60.0) -> None:
        if limit < 1:
            raise ValueError(f"rpm limit must be >= 1 request per window, got {limit}")
        self.limit = limit
        self.window_s = window_s
        self._accepted: dict[str, deque[float]] = {}

    def accept(self, client: str, now: float) -> bool:
        """Count one acceptance of `client` at `now`, or False when it is over its limit."""
        times = self._accepted.setdefault(client, deque())
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
        on, so it used no place in the window."""
        times = self._accepted.get(client)
        if times:
            times.pop()
