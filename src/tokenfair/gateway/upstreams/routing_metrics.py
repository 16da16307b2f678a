"""Routing's /metrics series, read from the router's plain counters at scrape time (the
hot path only adds to integers).

- `tokenfair:gateway_route_decisions_total{upstream,reason}`: requests sent to each
  upstream, by reason: affinity, first_placement, overload_diversion, least_loaded;
- `tokenfair:gateway_prefix_blocks_total{upstream}`: prompt blocks of those requests;
- `tokenfair:gateway_prefix_matched_blocks_total{upstream}`: of those, blocks the
  gateway had sent that upstream before: matched / blocks estimates the prefix hit rate
  routing achieves (the engine's own `prefix_cache_hits` says what it really found);
- `tokenfair:gateway_prefix_index_blocks{upstream}`: block hashes remembered.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenfair.gateway.upstreams.pool import UpstreamPool
from tokenfair.gateway.upstreams.routing import REASONS, PrefixAffinityRouter


class RoutingCollector(Collector):
    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        router = self.pool.router
        decisions = CounterMetricFamily(
            "tokenfair:gateway_route_decisions",
            "Requests sent to each upstream, by routing reason",
            labels=["upstream", "reason"],
        )
        blocks = CounterMetricFamily(
            "tokenfair:gateway_prefix_blocks",
            "Prompt blocks of the requests routed to each upstream",
            labels=["upstream"],
        )
        matched = CounterMetricFamily(
            "tokenfair:gateway_prefix_matched_blocks",
            "Prompt blocks routed to an upstream that had been sent them before",
            labels=["upstream"],
        )
        index = GaugeMetricFamily(
            "tokenfair:gateway_prefix_index_blocks",
            "Prefix block hashes the gateway remembers per upstream",
            labels=["upstream"],
        )
        affinity = router if isinstance(router, PrefixAffinityRouter) else None
        for upstream in self.pool.upstreams:
            stats = router.stats.get(upstream.name)
            for reason in REASONS:
                decisions.add_metric(
                    [upstream.name, reason], stats.decisions[reason] if stats else 0
                )
            if affinity is not None:
                blocks.add_metric([upstream.name], stats.blocks if stats else 0)
                matched.add_metric([upstream.name], stats.matched if stats else 0)
                index.add_metric([upstream.name], len(affinity.index(upstream.name)))
        yield decisions
        if affinity is not None:
            yield blocks
            yield matched
            yield index
