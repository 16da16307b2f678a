"""A replica's leases while Redis is unreachable: it fails open (leases.py's doc)."""

from __future__ import annotations

from tokenfair.gateway.upstreams.pool import Upstream


def fail_open(
    upstreams: list[Upstream], live: int, lasted: float, grace: float, raise_after: float
) -> bool:
    """Each upstream's lease after an outage of `lasted` seconds; True if one grew.

    Shares heard before the outage are stale: giving back on them would take a lease
    down as requests finish, and dispatch would stop for Redis. Past `raise_after` a
    lease below this replica's share (the capacity over the `live` replicas it last
    saw) is raised to it, none lowered (the others may still count this replica's
    leases), so that no tenant of this replica waits for Redis; past `grace`, every
    lease is exactly the share, and replicas cut off together are back within the
    capacity."""
    if lasted < min(grace, raise_after):
        for upstream in upstreams:  # a blip: the leases as they are, given back no more
            assert upstream.lease is not None
            upstream.lease.stop_giving_back()
        return False
    exact = lasted >= grace
    grew = False
    for upstream in upstreams:
        lease, cap = upstream.lease, upstream.config
        assert lease is not None
        slots = max(1, cap.max_concurrent // live) if cap.max_concurrent else 0
        tokens = max(1, cap.max_inflight_tokens // live) if cap.max_inflight_tokens else 0
        if not exact:
            slots, tokens = max(slots, lease.slots), max(tokens, lease.tokens)
        grew = lease.hold(slots, tokens) or grew
    return grew
