"""A completion request's bytes, from the client to an upstream and its answer back.

- `proxy.py`: the raw ASGI handler of the completion endpoints (authenticate, limits,
  queue, forward, relay, charge), the path every request takes;
- `requests.py`: what the gateway reads of a request body (everything else passes
  through); `upstream_tenant.py`: how the request's tenant reaches its upstream, by
  rewriting the outgoing request as its kind says (upstreams/kinds.py: `cache_salt`,
  `vllm_xargs.tenant`, a header);
- `relay.py`: the answer to the client, and an upstream's answer relayed into it and
  metered; `sse.py`: reading an upstream's stream on the way through.

The top room: may import, of the rest of the gateway, config.py, metrics.py (how a
request ended), flow/'s ticket, meter and token counting (admission and fairness as
types only), and upstreams/' pool (as a type), HTTP client and kinds. Nothing of
replicas/: a request is charged through the fairness seam.
"""
