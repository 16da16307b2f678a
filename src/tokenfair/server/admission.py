"""Overload control at the door, before a request reaches the scheduler.

- a tenant with `max_waiting` requests already waiting gets 429 (Retry-After);
- with `max_waiting_total` waiting across all tenants, everyone gets 503: the server
  itself is full, not one tenant over its share;
- a tenant's `rpm` limit (requests accepted in the last 60 s) gives 429 with the
  seconds until the oldest of them leaves the window.

"Waiting" here is accepted with no token yet: a request stops waiting when its first
token arrives or it ends. All of this runs on the event loop only.
"""

from __future__ import annotations

import math
from collections import deque

from tokenfair.server.errors import APIError
from tokenfair.server.tenants import Tenant

RPM_WINDOW_S = 60.0
RETRY_AFTER_FULL_S = 1


class Admission:
    """A ticket for one accepted request; `release()` once it stops waiting (idempotent)."""

    __slots__ = ("_control", "tenant", "waiting")

    def __init__(self, control: AdmissionControl, tenant: str) -> None:
        self._control = control
        self.tenant = tenant
        self.waiting = True

    def release(self) -> None:
        if self.waiting:
            self.waiting = False
            self._control._released(self.tenant)


class AdmissionControl:
    def __init__(self, max_waiting_total: int) -> None:
        if max_waiting_total < 1:
            raise ValueError("max_waiting_total must be >= 1")
        self.max_waiting_total = max_waiting_total
        self.waiting: dict[str, int] = {}
        self.total_waiting = 0
        self._accepted_at: dict[str, deque[float]] = {}

    def admit(self, tenant: Tenant, now: float) -> Admission:
        """Let one request of `tenant` in at time `now`, or raise APIError 429 / 503."""
        name = tenant.name
        if self.total_waiting >= self.max_waiting_total:
            raise APIError(
                503,
                f"the server is overloaded ({self.total_waiting} requests waiting); retry later",
                code="server_overloaded",
                headers={"Retry-After": str(RETRY_AFTER_FULL_S)},
            )
        waiting = self.waiting.get(name, 0)
        if waiting >= tenant.max_waiting:
            raise APIError(
                429,
                f"tenant {name!r} already has {waiting} requests waiting (max_waiting "
                f"{tenant.max_waiting}); retry later",
                code="tenant_queue_full",
                headers={"Retry-After": str(RETRY_AFTER_FULL_S)},
            )
        if tenant.rpm is not None:
            window = self._accepted_at.setdefault(name, deque())
            while window and window[0] <= now - RPM_WINDOW_S:
                window.popleft()
            if len(window) >= tenant.rpm:
                retry = max(1, math.ceil(window[0] + RPM_WINDOW_S - now))
                raise APIError(
                    429,
                    f"tenant {name!r} is over its rate limit of {tenant.rpm} requests per minute",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(retry)},
                )
            window.append(now)
        self.waiting[name] = waiting + 1
        self.total_waiting += 1
        return Admission(self, name)

    def _released(self, tenant: str) -> None:
        self.waiting[tenant] -= 1
        self.total_waiting -= 1
