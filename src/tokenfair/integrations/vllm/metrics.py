"""Where an operator sees the per-tenant counters: a log line, and optionally Prometheus.

The scheduler runs inside vLLM's engine-core process. vLLM's own `/metrics` is served
by the API-server process from a fixed set of scheduler statistics, so a scheduler
class cannot add series there. Hence:

- a status line in vLLM's log every `log_interval_s` (default 10 s) while the engine
  is busy: on by default, needs no port, and works the same offline, behind the OpenAI
  server and with data parallelism (each engine core logs its own counters);
- with `metrics_port`, a Prometheus endpoint served by prometheus-client (which vLLM
  installs) from the engine-core process, on metrics_port + the data-parallel rank.

Series (labels `engine`, the data-parallel rank, and `tenant`):
`tokenfair_vllm_counter` (the policy's virtual counter, gauge),
`tokenfair_vllm_prompt_tokens_total`, `tokenfair_vllm_cached_prompt_tokens_total`,
`tokenfair_vllm_output_tokens_total`, `tokenfair_vllm_requests_total`,
`tokenfair_vllm_finished_total`, `tokenfair_vllm_preemptions_total` (counters),
`tokenfair_vllm_waiting`, `tokenfair_vllm_running` (gauges).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tokenfair.integrations.vllm.driver import PolicyDriver, TenantStats

MAX_TENANTS_LOGGED = 12


def format_status(
    policy: str, counters: Mapping[str, float], tenants: Mapping[str, TenantStats]
) -> str:
    """One line: totals, then each tenant (largest counter first, at most a dozen)."""
    waiting = sum(s.waiting for s in tenants.values())
    running = sum(s.running for s in tenants.values())
    order = sorted(tenants, key=lambda t: (-counters.get(t, 0.0), t))
    parts = [f"tokenfair {policy}: {len(tenants)} tenants, {running} running, {waiting} waiting"]
    for tenant in order[:MAX_TENANTS_LOGGED]:
        s = tenants[tenant]
        counter = f"counter {counters[tenant]:.0f} " if tenant in counters else ""
        parts.append(
            f"{tenant}: {counter}in {s.prompt_tokens} out {s.output_tokens} "
            f"run {s.running} wait {s.waiting} preempted {s.preemptions}"
        )
    if len(order) > MAX_TENANTS_LOGGED:
        parts.append(f"(+{len(order) - MAX_TENANTS_LOGGED} more tenants)")
    return " | ".join(parts)


class StatusLog:
    """Logs `format_status` at most every `interval_s` (0: never), from the step loop."""

    def __init__(
        self,
        driver: PolicyDriver[Any],
        policy: str,
        interval_s: float,
        logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.driver = driver
        self.policy = policy
        self.interval_s = interval_s
        self.logger = logger
        self.clock = clock
        self._last = clock()

    def tick(self) -> None:
        if not self.interval_s:
            return
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._last = now
            self.logger.info(
                format_status(self.policy, self.driver.counters(), self.driver.tenants())
            )


_SERIES: tuple[tuple[str, str, str, Callable[[TenantStats], int]], ...] = (
    (
        "prompt_tokens_total",
        "counter",
        "Prompt tokens charged at first start",
        lambda s: s.prompt_tokens,
    ),
    (
        "cached_prompt_tokens_total",
        "counter",
        "Prompt tokens found in the prefix cache at first start",
        lambda s: s.cached_prompt_tokens,
    ),
    ("output_tokens_total", "counter", "Output tokens generated", lambda s: s.output_tokens),
    ("requests_total", "counter", "Requests received", lambda s: s.requests),
    ("finished_total", "counter", "Requests finished or aborted", lambda s: s.finished),
    (
        "preemptions_total",
        "counter",
        "Preemptions of the tenant's requests",
        lambda s: s.preemptions,
    ),
    ("waiting", "gauge", "Requests waiting in the fair queue", lambda s: s.waiting),
    ("running", "gauge", "Requests running", lambda s: s.running),
)


class _DriverCollector:
    """Reads the driver at scrape time (from the HTTP thread: copies only)."""

    def __init__(self, driver: PolicyDriver[Any], engine: str):
        self.driver = driver
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["engine", "tenant"]
        tenants = self.driver.tenants()
        counters = self.driver.counters()
        counter = GaugeMetricFamily(
            "tokenfair_vllm_counter", "The policy's virtual token counter", labels=labels
        )
        for tenant, value in sorted(counters.items()):
            counter.add_metric([self.engine, tenant], value)
        yield counter
        for name, kind, help_text, read in _SERIES:
            family: Any
            if kind == "counter":
                # prometheus-client appends _total to counter names itself.
                family = CounterMetricFamily(
                    f"tokenfair_vllm_{name.removesuffix('_total')}", help_text, labels=labels
                )
            else:
                family = GaugeMetricFamily(f"tokenfair_vllm_{name}", help_text, labels=labels)
            for tenant, stats in sorted(tenants.items()):
                family.add_metric([self.engine, tenant], read(stats))
            yield family


def serve_prometheus(driver: PolicyDriver[Any], host: str, port: int, engine: str) -> Any:
    """Start the endpoint in a daemon thread; return the server (shutdown() stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    registry.register(_DriverCollector(driver, engine))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise OSError(
            f"tokenfair.metrics_port: cannot serve metrics on {host}:{port}: {error.strerror}"
        ) from None
    return server
