"""How a step's outputs reach the streams on the loop: ends, then first tokens, then the
rest (time-sliced, each stream in order), and verdicts that wake their requests late."""

from __future__ import annotations

import asyncio

from tokenfair.core.request import Request, SamplingParams
from tokenfair.engine import engine_client
from tokenfair.engine.async_engine import AsyncEngine
from tokenfair.engine.engine import RequestOutput
from tokenfair.engine.engine_client import RequestStream, delivery_order

from .test_async_engine import make_engine


def request(rid: str) -> Request:
    return Request(rid, "a", 4, 0.0, sampling=SamplingParams(max_tokens=10))


def output_of(req: Request, text: str, finished: bool = False) -> RequestOutput:
    """An output adding one token, labelled by its text."""
    req.append_output(req.num_output_tokens)
    return RequestOutput(req, [req.output_token_ids[-1]], new_text=text, finished=finished)


def registered_streams(
    engine: AsyncEngine, n: int, sink=None, fresh: range = range(0)
) -> list[RequestStream]:
    """n registered streams whose requests already have one token, but for those
    numbered in `fresh`, whose first token is yet to come (no engine thread)."""
    engine._loop = asyncio.get_running_loop()
    streams = []
    for i in range(n):
        stream = RequestStream(request(f"r{i}"), engine._loop)
        stream.sink = sink
        if i not in fresh:
            stream.request.append_output(0)
        engine.streams[stream.request_id] = stream
        streams.append(stream)
    return streams


def test_delivery_order_puts_ends_then_first_tokens_first():
    reqs = [request(f"r{i}") for i in range(6)]
    for req in reqs[:4]:
        req.append_output(0)  # r0-r3 already have a token
    outputs = [
        output_of(reqs[0], "middle-0"),
        output_of(reqs[4], "first-4"),
        output_of(reqs[1], "end-1", finished=True),
        output_of(reqs[2], "middle-2"),
        output_of(reqs[5], "first-5", finished=True),  # one token and done: an end
        output_of(reqs[3], "end-3", finished=True),
    ]
    ordered, urgent = delivery_order(outputs)
    assert [o.new_text for o in ordered] == [
        "end-1", "first-5", "end-3", "first-4", "middle-0", "middle-2"
    ]  # fmt: skip
    assert urgent == 4


def test_urgent_outputs_go_out_in_the_first_slice_whatever_the_budget(monkeypatch):
    monkeypatch.setattr(engine_client, "DELIVERY_SLICE_S", 0.0)  # else one output a slice
    delivered: list[str] = []

    def record(output: RequestOutput) -> bool:
        delivered.append(output.new_text)
        return True

    async def main() -> list[str]:
        engine = AsyncEngine(make_engine())
        # r8-r11 get their first token in this step
        streams = registered_streams(engine, 12, record, fresh=range(8, 12))
        step = []
        for i, stream in enumerate(streams):
            step.append(output_of(stream.request, f"r{i}", finished=i == 1))
        engine._dispatch(*delivery_order(step), 1.0, 1)
        in_first_slice = list(delivered)
        while engine._delivering:
            await asyncio.sleep(0)
        return in_first_slice

    in_first_slice = run(main())
    assert in_first_slice[0] == "r1"  # the end
    assert set(in_first_slice[1:5]) == {"r8", "r9", "r10", "r11"}  # the first tokens
    assert len(in_first_slice) == 5  # and then the (zero) budget is spent
    assert sorted(delivered[5:]) == sorted(f"r{i}" for i in (0, 2, 3, 4, 5, 6, 7))


def test_slices_keep_each_streams_order_when_the_next_step_arrives_meanwhile(monkeypatch):
    """The next step's outputs, arriving before the last slice of a step is out, come
    after it (and, the loop being behind, go to the readers in one go)."""
    monkeypatch.setattr(engine_client, "DELIVERY_SLICE_S", 0.0)  # one output per slice
    offered: list[str] = []

    def record(output: RequestOutput) -> bool:
        offered.append(output.new_text)
        return False  # leave it to the reader

    async def main() -> dict[str, list[str]]:
        engine = AsyncEngine(make_engine())
        streams = registered_streams(engine, 24, record)
        step1 = [output_of(s.request, f"{s.request_id}:1") for s in streams]
        engine._dispatch(*delivery_order(step1), 1.0, 1)
        assert len(offered) == 1  # one slice now, the rest on later turns of the loop
        step2 = [output_of(s.request, f"{s.request_id}:2", finished=True) for s in streams]
        engine._dispatch(*delivery_order(step2), 2.0, 2)
        return {s.request_id: [o.new_text async for o in s] for s in streams}

    seen = run(main())
    assert all(texts == [f"{rid}:1", f"{rid}:2"] for rid, texts in seen.items()), seen
    # While step 2 waited (the loop behind), step 1's outputs bypassed the sinks.
    assert [text for text in offered if text.endswith(":1")] == ["r0:1"]


def test_a_request_that_ends_before_its_verdict_wakes_it_still_gets_the_verdict():
    """A loop far behind reads a verdict and the request's whole life at once: the
    verdict, applied at once but waking the request later, must still come."""

    async def main() -> tuple[bool, list[str]]:
        engine = AsyncEngine(make_engine())
        (stream,) = registered_streams(engine, 1)
        engine._accepted([(stream.request_id, True)])
        assert not stream.accepted.done()  # woken a little later
        steps = [output_of(stream.request, "a"), output_of(stream.request, "b", finished=True)]
        for n, output in enumerate(steps):
            engine._dispatch(*delivery_order([output]), float(n), n)
        accepted = await asyncio.wait_for(stream.accepted, 1)
        return accepted, [o.new_text async for o in stream]

    assert run(main()) == (True, ["a", "b"])


def test_a_refusal_ends_the_stream_at_once_and_wakes_it_with_false():
    async def main() -> tuple[bool, bool, list[RequestOutput]]:
        engine = AsyncEngine(make_engine())
        (stream,) = registered_streams(engine, 1)
        engine._accepted([(stream.request_id, False)])
        closed_at_once = stream.request_id not in engine.streams
        accepted = await asyncio.wait_for(stream.accepted, 1)
        return closed_at_once, accepted, [o async for o in stream]

    assert run(main()) == (True, False, [])


def run(coro):
    return asyncio.run(coro)


def test_middle_tokens_and_verdict_wake_ups_wait_while_requests_are_taken_in():
    """While new requests wait for their handlers (urgent_work), a step's middle tokens
    and the wake-up of accepted requests wait for them; its urgent outputs do not."""
    delivered: list[str] = []

    def record(output: RequestOutput) -> bool:
        delivered.append(output.new_text)
        return True

    async def main() -> tuple[list[str], bool, list[str], bool]:
        engine = AsyncEngine(make_engine())
        arrivals = [True]
        engine.urgent_work = lambda: arrivals[0]
        streams = registered_streams(engine, 6, record, fresh=range(1))  # r0: first token
        waiting = RequestStream(request("new"), engine._loop)
        engine.streams["new"] = waiting
        step = [output_of(s.request, s.request_id, finished=s is streams[1]) for s in streams]
        engine._dispatch(*delivery_order(step), 1.0, 1)
        engine._accepted([("new", True)])
        for _ in range(20):  # turns of the loop with requests still waiting
            await asyncio.sleep(0)
        meanwhile, woken_meanwhile = list(delivered), waiting.accepted.done()
        arrivals[0] = False  # their handlers ran
        while engine._delivering or not waiting.accepted.done():
            await asyncio.sleep(0)
        return meanwhile, woken_meanwhile, delivered, await waiting.accepted

    meanwhile, woken_meanwhile, delivered_all, accepted = run(main())
    assert meanwhile == ["r1", "r0"]  # the end and the first token only
    assert not woken_meanwhile
    assert sorted(delivered_all) == [f"r{i}" for i in range(6)] and accepted


def test_lower_priority_work_waits_no_longer_than_its_bound(monkeypatch):
    """A count that never clears (say, a miscount) delays the rest of a step by at most
    MAX_YIELD_S: here none at all."""
    monkeypatch.setattr(engine_client, "MAX_YIELD_S", 0.0)

    async def main() -> tuple[list[str], bool]:
        engine = AsyncEngine(make_engine())
        engine.urgent_work = lambda: True
        streams = registered_streams(engine, 3)
        engine._dispatch(*delivery_order([output_of(s.request, "t") for s in streams]), 1.0, 1)
        waiting = RequestStream(request("new"), engine._loop)
        engine.streams["new"] = waiting
        engine._accepted([("new", True)])
        for _ in range(10):
            await asyncio.sleep(0)
        taken = [o.new_text for s in streams for o in s._pending]
        return taken, waiting.accepted.done()

    assert run(main()) == (["t"] * 3, True)
