"""The engine in its own process: what only a process has (its card, its build errors,
crashes, a killed child, a server gone, the frames, calls that must pickle). What it
promises alike with the thread is in test_engine_contract.py.

Each test launches a real child (`python -m tokenfair.engine.engine_core`) that builds
a sim: engine with the server's own factory.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import time

import pytest

from tokenfair.core.request import Request, SamplingParams
from tokenfair.engine.engine_client import EngineDeadError
from tokenfair.engine.engine_process import EngineBuildError, EngineProcess
from tokenfair.engine.frames import FrameBuffer, frame
from tokenfair.server.model import ServedModel, build_engine_and_card

USED_BLOCKS = operator.attrgetter("scheduler.kv.num_used_blocks")


def launch(step_s: float = 0.0, **options: object) -> EngineProcess:
    kwargs = {"spec": f"sim:fixed:{step_s}", "policy": "vtc", **options}
    return EngineProcess.launch(build_engine_and_card, kwargs)


def request(engine: EngineProcess, rid: str, max_tokens: int, client: str = "a") -> Request:
    sampling = SamplingParams(max_tokens=max_tokens)
    return Request(rid, client, 4, engine.now(), sampling=sampling)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_the_card_describes_the_engine_it_came_from():
    engine = launch(kv_tokens=4096, block_size=16)
    try:
        card = engine.card
        assert isinstance(card, ServedModel) and card.engine is None
        assert card.kv_tokens == 4096 and card.kv_block_size == 16
        assert card.policy_name == "vtc" and card.is_sim
        # The child's clock and ours agree (one system-wide monotonic clock).
        assert 0 <= engine.now() < 60
    finally:
        run(engine.stop())


def test_a_bad_build_is_a_one_line_error():
    for spec, options, named in [
        ("sim:no-such-profile", {}, "no-such-profile"),
        ("sim:zero", {"max_num_seqs": 0}, "max_num_seqs"),
    ]:
        with pytest.raises(EngineBuildError) as refused:
            EngineProcess.launch(build_engine_and_card, {"spec": spec, **options})
        message = str(refused.value)
        assert named in message
        assert "\n" not in message and "Traceback" not in message


def test_a_crash_in_a_step_fails_the_streams_and_the_engine():
    async def main() -> None:
        engine = launch(step_s=0.002)
        engine.start()
        running = engine.submit(request(engine, "r", 10_000))
        await running.accepted
        # Break the engine where it runs: the next step raises.
        await engine.call(operator.methodcaller("__setattr__", "executor", None))
        async with asyncio.timeout(30):
            async for _ in running:
                pass
        assert running.done and not engine.alive
        assert isinstance(engine.error, EngineDeadError)
        with pytest.raises(EngineDeadError):
            engine.submit(request(engine, "late", 1))
        await engine.stop()
        assert engine.process.returncode not in (0, None)

    run(main())


def test_a_killed_engine_process_ends_every_stream():
    async def main() -> None:
        engine = launch(step_s=0.002)
        engine.start()
        streams = [engine.submit(request(engine, f"r{i}", 10_000)) for i in range(4)]
        await asyncio.gather(*(s.accepted for s in streams))
        os.kill(engine.process.pid, signal.SIGKILL)
        async with asyncio.timeout(30):
            for stream in streams:
                async for _ in stream:
                    pass
        assert not engine.alive
        await engine.stop()

    run(main())


def test_the_engine_process_exits_when_the_server_goes():
    engine = launch(step_s=0.002)
    engine._sock.close()  # what the server's death does to the child's socket
    deadline = time.monotonic() + 30
    while engine.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.process.returncode == 0


def test_frames_arrive_whole_however_the_bytes_are_split():
    messages = [("request", i, "x" * i) for i in range(50)]
    data = frame(messages[:20]) + frame(messages[20:]) + frame([("stop",)])
    frames = FrameBuffer()
    got = []
    for i in range(len(data)):
        got.extend(frames.feed(data[i : i + 1]))
    assert got == [*messages, ("stop",)]


def test_a_call_that_cannot_pickle_is_refused_and_the_link_stays_usable():
    async def main() -> int:
        engine = launch()
        engine.start()
        with pytest.raises(TypeError, match="must pickle"):
            await engine.call(lambda e: e.num_steps)
        stream = engine.submit(request(engine, "r", 3))
        tokens = sum([len(o.new_token_ids) async for o in stream])
        assert await engine.call(USED_BLOCKS) == 0
        await engine.stop()
        return tokens

    assert run(main()) == 3


def test_calls_fail_once_the_engine_process_is_gone():
    async def main() -> None:
        engine = launch()
        engine.start()
        os.kill(engine.process.pid, signal.SIGKILL)
        engine.process.wait()
        with pytest.raises(EngineDeadError):
            await engine.call(USED_BLOCKS)
        await engine.stop()

    run(main())
