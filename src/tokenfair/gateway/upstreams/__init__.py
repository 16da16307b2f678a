"""The upstreams: who serves which model, how loaded and healthy each is, and where an
admitted request goes.

- `pool.py`: the upstreams, their capacity and load (their own /metrics, optionally),
  the health checks, and `UpstreamPool.choose`;
- `routing.py`: the router `choose` asks (least-loaded, or prefix affinity over the
  prompt-prefix index of `prefix.py`); `routing_metrics.py`: its /metrics series;
- `probe.py`: what the gateway reaches (the upstreams, Redis), for `--check` and the
  start.

May import, of the rest of the gateway: config.py, transport/upstream_client.py (the
one HTTP client, for the health checks, scrapes and probes), flow/tokens.py (a
prompt's text, for its prefix key), replicas/capacity.py (a replica's lease on an
upstream) and replicas/redis_client.py (the probe asks Redis).
"""
