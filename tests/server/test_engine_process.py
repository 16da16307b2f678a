"""The engine in its own process: the same contract as on a thread, across a socket.

Each test launches a real child (`python -m tokenfair.engine.engine_core`) that builds
a sim: engine with the server's own factory; calls use picklable functions
(operator.attrgetter, methodcaller), as a server's calls must.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import time

import pytest

from tokenfair.core.request import FinishReason, Request, SamplingParams
from tokenfair.engine.engine_client import EngineDeadError
from tokenfair.engine.engine_process import EngineBuildError, EngineProcess
from tokenfair.engine.frames import FrameBuffer, frame
from tokenfair.server.model import ServedModel, build_engine_and_card

USED_BLOCKS = operator.attrgetter("scheduler.kv.num_used_blocks")
RUNNING = operator.attrgetter("scheduler.running")


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


def test_streams_every_token_and_mirrors_the_request():
    async def main() -> tuple[list, Request]:  # type: ignore[type-arg]
        engine = launch()
        engine.start()
        stream = engine.submit(request(engine, "r", 5))
        assert await stream.accepted
        outputs = [o async for o in stream]
        await engine.stop()
        return outputs, stream.request

    outputs, mirrored = run(main())
    assert sum(len(o.new_token_ids) for o in outputs) == 5
    assert "".join(o.new_text for o in outputs) == " tok" * 5
    assert outputs[-1].finished and outputs[-1].finish_reason is FinishReason.LENGTH
    # What the server reads of a request arrived with the outputs.
    assert len(mirrored.output_token_ids) == 5
    assert mirrored.first_token_s is not None and mirrored.finish_s is not None
    assert mirrored.arrival_s <= mirrored.first_token_s <= mirrored.finish_s


def test_abort_is_honoured_before_the_next_step_and_frees_the_blocks():
    async def main() -> tuple[int, int, int]:
        engine = launch(step_s=0.005)
        engine.start()
        stream = engine.submit(request(engine, "r", 10_000))
        await stream.accepted
        await stream.next_batch()  # running now
        assert await engine.call(USED_BLOCKS) > 0
        engine.abort("r")
        seen = sum([len(o.new_token_ids) async for o in stream])
        blocks = await engine.call(USED_BLOCKS)
        running = len(await engine.call(RUNNING))
        reason = stream.finish_reason
        await engine.stop()
        assert reason is FinishReason.ABORT
        return seen, blocks, running

    seen, blocks, running = run(main())
    assert seen < 50
    assert blocks == 0 and running == 0


def test_a_refused_request_resolves_accepted_false():
    async def main() -> tuple[bool, bool]:
        engine = launch(kv_tokens=64)
        engine.start()
        stream = engine.submit(request(engine, "big", 500))
        accepted = await stream.accepted
        done = stream.done
        await engine.stop()
        return accepted, done

    assert run(main()) == (False, True)


def test_calls_return_results_and_raise_the_engines_errors():
    async def main() -> None:
        engine = launch(max_num_seqs=8)
        engine.start()
        assert await engine.call(operator.attrgetter("scheduler.config.max_num_seqs")) == 8
        with pytest.raises(AttributeError):
            await engine.call(operator.attrgetter("no_such_thing"))
        await engine.stop()
        with pytest.raises(EngineDeadError):
            engine.submit(request(engine, "late", 1))
        assert engine.process.returncode == 0

    run(main())


def test_many_concurrent_streams_finish():
    async def main() -> int:
        engine = launch(max_num_seqs=64, kv_tokens=65536)
        engine.start()
        streams = [
            engine.submit(request(engine, f"r{i}", 20, client=f"c{i % 4}")) for i in range(200)
        ]

        async def drain(stream) -> int:  # type: ignore[no-untyped-def]
            return sum([len(o.new_token_ids) async for o in stream])

        counts = await asyncio.gather(*(drain(s) for s in streams))
        await engine.stop()
        return sum(counts)

    assert run(main()) == 200 * 20


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


def test_stopping_ends_the_streams_in_flight_as_aborted():
    async def main() -> list[FinishReason | None]:
        engine = launch(step_s=0.002)
        engine.start()
        streams = [engine.submit(request(engine, f"r{i}", 10_000)) for i in range(3)]
        assert all([await s.accepted for s in streams])
        for stream in streams:
            await stream.next_batch()  # running
        for request_id in list(engine.streams):  # what the server does on shutdown
            engine.abort(request_id)
        await engine.stop()
        assert engine.process.returncode == 0
        assert all(s.done for s in streams)
        return [s.finish_reason for s in streams]

    assert run(main()) == [FinishReason.ABORT] * 3


def test_a_refused_request_says_why():
    async def main() -> FinishReason | None:
        engine = launch(kv_tokens=64)
        engine.start()
        stream = engine.submit(request(engine, "big", 500))
        assert not await stream.accepted
        await engine.stop()
        return stream.finish_reason

    assert run(main()) is FinishReason.REJECTED


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
