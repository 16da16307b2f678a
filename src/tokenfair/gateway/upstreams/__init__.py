"""The upstreams: who serves which model, how loaded and healthy each is, and where an
admitted request goes.

- `pool.py`: the upstreams, their capacity and load (their own /metrics, optionally),
  the health checks, and `UpstreamPool.choose`;
- `routing.py`: the router `choose` asks (least-loaded, or prefix affinity over the
  prompt-prefix index of `prefix.py`); `routing_metrics.py`: its /metrics series;
- `client.py`: the gateway's one HTTP client (the requests' hot path, and the health
  checks', scrapes' and probes' GETs);
- `kinds.py`: the kinds of upstream (`engine:`), one object each: how a tenant reaches
  it, its cache salt, its metrics;
- `capacity.py`: a replica's lease on an upstream and what its waiting requests need
  (the pool holds the lease; replicas/leases.py settles it with the others; every
  change of it is one of its own methods: give back, settle, grant, hold).

The lowest room: may import, of the rest of the gateway, config.py and messages.py (a
prompt's text, for its prefix key) alone.
"""
