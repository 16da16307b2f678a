"""`tokenfair gateway`: a fair proxy in front of existing engines (docs/gateway.md).

One room per idea:

- `transport/`: a completion request's bytes, from the client to an upstream and its
  answer back (the proxy, the relay, the gateway's one HTTP client);
- `flow/`: which waiting request goes next, and what it costs its tenant (admission,
  its three seams, the meter, token counting);
- `upstreams/`: who serves which model, how loaded and healthy each is, and where an
  admitted request goes (the pool, routing, the prefix index, the probes);
- `replicas/`: what the gateway replicas share through Redis (VTC's counters, each
  upstream's capacity as leases, the Redis connections);
- here, above every room: `app.py` (the process: its parts, their wiring and
  lifecycle), `side_app.py` (every endpoint but the completions), `openapi.py`,
  `reach.py`; and between them: `config.py` (read by every room, reading only the
  upstream kinds), `metrics.py` (read by `transport/`), `messages.py` (below all).

Each room's docstring says what it may import from the others (tests/test_layering.py
checks it); no module imports one that imports it back.
"""
