"""The engine on its thread: idle sleep, slow readers, sinks. The loop side's delivery
order is in test_delivery.py; what both engines promise alike, in test_engine_contract.py."""

from __future__ import annotations

import asyncio

from tokenfair.core.policies import make_policy
from tokenfair.core.request import Request, SamplingParams
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.async_engine import AsyncEngine
from tokenfair.engine.engine import Engine, RequestOutput
from tokenfair.engine.engine_client import RequestStream
from tokenfair.engine.sim.wall_clock import SimDetokenizer, WallClockSimExecutor, sim_profile


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
    req.append_output(req.num_output_tokens)
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
