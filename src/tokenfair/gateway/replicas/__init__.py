"""What the gateway replicas share through Redis.

- VTC's counters per node of the group tree: `counters.py` (the store's interface, and
  the store of one process), `redis_store.py` (each replica decides on its copy, which
  `lua.py`'s script merges with Redis in the background);
- each upstream's capacity shared as leases: `leases.py`, settled by the script of
  `lease_script.py` (`lease_division.py`: who is due what; `lease_outage.py`: failing
  open), on the leases upstreams/capacity.py describes;
- `redis_client.py`: Redis connections (short timeouts, one retry on a broken
  connection, callers queued for a free one).

Above upstreams/, below flow/: may import, of the rest of the gateway, upstreams/pool.py
and upstreams/capacity.py alone (leases.py sets each upstream's lease). The counters are charged only through flow/fairness.py; app.py
builds and starts the stores, and metrics.py and the state page read them.
"""
