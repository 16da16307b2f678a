"""The engine on its thread, and the loop side's delivery: idle sleep, slow readers, sinks,
slices. What both engines promise alike is in test_engine_contract.py."""

from __future__ import annotations

import asyncio

from tokenfair.core.policies import make_policy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine import engine_client
from tokenfair.engine.async_engine import AsyncEngine
from tokenfair.engine.engine import Engine, RequestOutput
from tokenfair.engine.engine_client import RequestStream
from tokenfair.server.sim_model import SimDetokenizer, WallClockSimExecutor, sim_profile


def make_engine(step_s: float = 0.0, max_num_seqs: int = 8, kv_tokens: int = 4096) -> Engine:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, kv_tokens=kv_tokens)
    return Engine(
        Scheduler(config, make_policy("vtc")),
        WallClockSimExecutor(sim_profile(f"fixed:{step_s}")),
        detokenizer=SimDetokenizer(),
    )


def request(rid: str, max_tokens: int, client: str = "a", prompt: int = 4) -> Request:
    return Request(rid, client, prompt, 0.0, sampling=SamplingParams(max_tokens=max_tokens))


def run(coro):
    return asyncio.run(coro)


def test_thread_sleeps_when_idle_and_wakes_on_submit():
    async def main() -> tuple[int, int, bool]:
        core = make_engine()
        engine = AsyncEngine(core)
        engine.start()
        await asyncio.sleep(0.2)
        idle_steps = core.num_steps
        stream = engine.submit(request("r", 3))
        async for _ in stream:
            pass
        await asyncio.sleep(0.2)
        after = core.num_steps
        alive = engine.alive
        await engine.stop()
        return idle_steps, after, alive

    idle_steps, after, alive = run(main())
    assert idle_steps == 0
    assert 3 <= after <= 6  # the request's steps and nothing while idle
    assert alive


def test_a_slow_reader_never_stalls_the_steps():
    async def main() -> tuple[int, int]:
        core = make_engine(step_s=0.002)
        engine = AsyncEngine(core)
        engine.start()
        slow = engine.submit(request("slow", 200, client="a"))
        fast = engine.submit(request("fast", 50, client="b"))
        async for _ in fast:
            pass
        steps_when_fast_done = core.num_steps
        # Nobody has read `slow` yet; its tokens waited in its stream.
        batch = await slow.next_batch()
        await engine.stop()
        return steps_when_fast_done, sum(len(o.new_token_ids) for o in batch)

    steps, buffered = run(main())
    assert steps >= 50
    assert buffered >= 45


def output_of(req: Request, text: str, finished: bool = False) -> RequestOutput:
    """An output adding one token, labelled by its text."""
    req.output_token_ids.append(len(req.output_token_ids))
    return RequestOutput(req, [req.output_token_ids[-1]], new_text=text, finished=finished)


def test_a_sink_takes_outputs_and_a_refusal_hands_the_rest_to_the_reader_in_order():
    async def main() -> tuple[list[str], list[str]]:
        stream = RequestStream(request("r", 10), asyncio.get_running_loop())
        taken: list[str] = []
        refuse = {"2", "3"}  # the sink refuses these two (a slow client, say)

        def sink(output: RequestOutput) -> bool:
            if output.new_text in refuse:
                return False
            taken.append(output.new_text)
            return True

        stream.sink = sink
        for i in range(3):
            stream._put(output_of(stream.request, str(i)))
        # "2" was refused: "3" and "4" must queue behind it, never overtake it, even
        # though the sink would take "4".
        stream._put(output_of(stream.request, "3"))
        stream._put(output_of(stream.request, "4"))
        read = [o.new_text for o in await stream.next_batch()]
        # Once the reader has caught up the sink takes outputs again.
        stream._put(output_of(stream.request, "5"))
        return taken, read

    taken, read = run(main())
    assert taken == ["0", "1", "5"]
    assert read == ["2", "3", "4"]


def streams_with_one_token(engine: AsyncEngine, n: int, sink=None) -> list[RequestStream]:
    """n registered streams whose requests already have one token (no engine thread)."""
    engine._loop = asyncio.get_running_loop()
    streams = []
    for i in range(n):
        stream = RequestStream(request(f"r{i}", 10), engine._loop)
        stream.sink = sink
        stream.request.output_token_ids.append(0)
        engine.streams[stream.request_id] = stream
        streams.append(stream)
    return streams


def test_first_tokens_and_ends_go_out_first(monkeypatch):
    monkeypatch.setattr(engine_client, "DELIVERY_SLICE_S", 0.0)  # one output per slice
    delivered: list[str] = []

    def record(output: RequestOutput) -> bool:
        delivered.append(output.new_text)
        return True

    async def main() -> None:
        engine = AsyncEngine(make_engine())
        streams = streams_with_one_token(engine, 12, record)
        step = []
        for i, stream in enumerate(streams):
            if i >= 8:
                del stream.request.output_token_ids[0]  # r8-r11: their first token
            step.append(output_of(stream.request, f"r{i}", finished=i == 1))
        engine._dispatch(step, 1.0, 1)
        while engine._delivering:
            await asyncio.sleep(0)

    run(main())
    assert delivered[0] == "r1"  # the end
    assert set(delivered[1:5]) == {"r8", "r9", "r10", "r11"}  # the first tokens
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
        streams = streams_with_one_token(engine, 24, record)
        engine._dispatch([output_of(s.request, f"{s.request_id}:1") for s in streams], 1.0, 1)
        assert len(offered) == 1  # one slice now, the rest on later turns of the loop
        step2 = [output_of(s.request, f"{s.request_id}:2", finished=True) for s in streams]
        engine._dispatch(step2, 2.0, 2)
        return {s.request_id: [o.new_text async for o in s] for s in streams}

    seen = run(main())
    assert all(texts == [f"{rid}:1", f"{rid}:2"] for rid, texts in seen.items()), seen
    # While step 2 waited (the loop behind), step 1's outputs bypassed the sinks.
    assert [text for text in offered if text.endswith(":1")] == ["r0:1"]
