"""A tenant's limits at the door, before a request waits for the scheduler.

The server and the gateway apply the same three, in this order:

- with `max_waiting_total` requests waiting across all tenants, everyone gets 503
  (`server_overloaded`): the server (or gateway) itself is full, not one tenant over
  its share;
- a tenant with `max_waiting` requests already waiting gets 429 (`tenant_queue_full`);
- a tenant's `rpm` (requests accepted in the last 60 s, the core's `RateWindow`) gives
  429 (`rate_limit_exceeded`) with the seconds until the oldest leaves the window; only
  requests that pass the two checks above count.

"Waiting" is up to the caller: in the server, accepted with no token yet; in the
gateway, queued for an upstream. All of this runs on the event loop only.
"""

from __future__ import annotations

import math

from tokenfair.core.rate_window import RateWindow
from tokenfair.edge.errors import APIError, ErrorCode
from tokenfair.edge.tenants import Tenant

RPM_WINDOW_S = 60.0
RETRY_AFTER_FULL_S = 1


class WaitingSlot:
    """One accepted request's place among the waiting; `release()` once it stops
    waiting (idempotent)."""

    __slots__ = ("_limits", "_window", "tenant", "waiting")

    def __init__(self, limits: Limits, tenant: str, window: RateWindow | None) -> None:
        self._limits = limits
        self._window = window  # the rpm window this request took a place in
        self.tenant = tenant
        self.waiting = True

    def release(self) -> None:
        if self.waiting:
            self.waiting = False
            self._limits._released(self.tenant)

    def refund(self) -> None:
        """Release, and give back the request's place in its tenant's rpm window: it
        was admitted, then refused as a whole (another choice of the same request was
        refused), so it used none."""
        if self._window is not None:
            self._window.unaccept(self.tenant)
            self._window = None
        self.release()


class Limits:
    def __init__(self, max_waiting_total: int, who: str = "the server") -> None:
        if max_waiting_total < 1:
            raise ValueError("max_waiting_total must be >= 1")
        self.max_waiting_total = max_waiting_total
        self.who = who  # named in the 503's message
        self.waiting: dict[str, int] = {}
        self.total_waiting = 0
        self._windows: dict[str, RateWindow] = {}

    def admit(self, tenant: Tenant, now: float) -> WaitingSlot:
        """Let one request of `tenant` in at time `now`, or raise APIError 429 / 503."""
        name = tenant.name
        if self.total_waiting >= self.max_waiting_total:
            raise APIError(
                503,
                f"{self.who} is overloaded ({self.total_waiting} requests waiting); retry later",
                code=ErrorCode.OVERLOADED,
                headers={"Retry-After": str(RETRY_AFTER_FULL_S)},
            )
        waiting = self.waiting.get(name, 0)
        if waiting >= tenant.max_waiting:
            raise APIError(
                429,
                f"tenant {name!r} already has {waiting} requests waiting (max_waiting "
                f"{tenant.max_waiting}); retry later",
                code=ErrorCode.TENANT_QUEUE_FULL,
                headers={"Retry-After": str(RETRY_AFTER_FULL_S)},
            )
        window = None
        if tenant.rpm is not None:
            window = self._windows.get(name)
            if window is None or window.limit != tenant.rpm:  # new, or changed by a reload
                window = self._windows[name] = RateWindow(tenant.rpm, RPM_WINDOW_S)
            if not window.accept(name, now):
                retry = max(1, math.ceil(window.retry_after(name, now)))
                raise APIError(
                    429,
                    f"tenant {name!r} is over its rate limit of {tenant.rpm} requests per minute",
                    code=ErrorCode.RATE_LIMIT,
                    headers={"Retry-After": str(retry)},
                )
        self.waiting[name] = waiting + 1
        self.total_waiting += 1
        return WaitingSlot(self, name, window)

    def _released(self, tenant: str) -> None:
        left = self.waiting[tenant] - 1
        if left:
            self.waiting[tenant] = left
        else:
            del self.waiting[tenant]
        self.total_waiting -= 1
