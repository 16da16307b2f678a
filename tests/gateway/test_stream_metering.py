"""A stream read on its way through the gateway: events pass on as they came, tokens
are counted and charged chunk by chunk along the tenant's group path (through the
band's fairness seam, the one door to the counters), and the usage at the end settles
the charge."""

from __future__ import annotations

import orjson
import pytest

from tokenfair.core.cost import LinearCost
from tokenfair.gateway.flow.fairness import CounterFairness, PolicyFairness
from tokenfair.gateway.flow.meter import Meter
from tokenfair.gateway.flow.order import ORDERS
from tokenfair.gateway.replicas.counters import Charge, MemoryCounterStore
from tokenfair.gateway.transport.sse import SSEReader


class RecordingFairness:
    """What the meter is given: the fairness seam's `charge`."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.calls = 0

    def charge(self, charge: Charge) -> None:
        self.calls += 1
        for node, amount in charge:
            self.totals[node] = self.totals.get(node, 0.0) + amount


GROUPED = (("@org", 2.0), ("@org/search", 4.0), ("key-a", 1.0))


def event(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chunk(text: str | None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


@pytest.mark.parametrize("tokens", [1, 3])
def test_each_streamed_chunk_charges_every_node_on_the_path_by_its_weight(tokens: int):
    seam = RecordingFairness()
    cost = LinearCost(w_in=1.0, w_out=2.0)
    meter = Meter(seam, GROUPED, cost, 10, 100, stream=True)  # type: ignore[arg-type]
    meter.on_chunk(tokens)
    meter.on_chunk(tokens)
    service = 2 * cost.w_out * tokens
    assert seam.totals == {node: pytest.approx(service / w) for node, w in GROUPED}
    assert meter.output == meter.streamed == 2 * tokens
    # The usage replaces the estimate: only the difference is charged.
    meter.on_usage(10, 2 * tokens + 1)
    assert seam.totals["key-a"] == pytest.approx(2 * (2 * tokens + 1))
    meter.on_chunk(1)  # after the usage: counted as streamed, never charged again
    assert seam.totals["key-a"] == pytest.approx(2 * (2 * tokens + 1))


def test_free_output_tokens_charge_nothing_per_chunk():
    seam = RecordingFairness()
    meter = Meter(seam, (("a", 1.0),), LinearCost(w_in=1.0, w_out=0.0), 10, 100, stream=True)  # type: ignore[arg-type]
    meter.on_chunk(1)
    assert seam.calls == 0 and meter.output == 1


def test_the_meter_charges_the_counters_through_the_fairness_seam():
    store = MemoryCounterStore()
    seam = CounterFairness(store, ORDERS["arrival"])
    meter = Meter(seam, GROUPED, LinearCost(w_in=1.0, w_out=2.0), 10, 100, stream=True)
    meter.on_chunk(1)
    meter.on_chunk(2)
    assert store.counters() == {node: pytest.approx(3 * 2.0 / w) for node, w in GROUPED}
    # The core's ordering policies keep no counters: their seam takes the charge, and
    # nothing changes.
    policy = Meter(PolicyFairness("fcfs"), GROUPED, LinearCost(), 10, 100, stream=True)
    policy.on_chunk(1)
    policy.on_usage(10, 1)
    assert policy.output == 1 and policy.service() == pytest.approx(10 + 2 * 1)


def test_a_reader_passes_events_on_as_they_came_and_counts_their_tokens():
    counted: list[int] = []
    usages: list[tuple[int, int, int]] = []
    reader = SSEReader(lambda text: len(text), counted.append, lambda *u: usages.append(u), True)
    first, second = chunk("hello"), chunk("!", finish="stop")
    # An event split across reads comes out whole, once complete.
    assert reader.feed(first[:9]) == b""
    assert reader.feed(first[9:] + second) == first + second
    assert counted == [5, 1] and reader.finish_reason == "stop"
    # A choice that is not an object is skipped, the rest of the event still read.
    odd = event({"choices": ["?", {"delta": {"content": "ab"}, "finish_reason": "length"}]})
    assert reader.feed(odd) == odd
    assert counted == [5, 1, 2] and reader.finish_reason == "length"
    # With several choices the request ended as its first did (the server counts it so).
    later = event({"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]})
    assert reader.feed(later) == later and reader.finish_reason == "length"
    # The usage-only chunk the gateway asked for itself is held back.
    usage = event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 8}})
    assert reader.feed(usage + b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    assert usages == [(3, 8, 0)] and reader.saw_done
