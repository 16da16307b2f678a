"""What the server relies on from its engine, on a thread and in a process alike.

Each test runs against both `EngineClient`s, built by the server's own factories from a
sim: spec: `AsyncEngine` over `build_served_model`, `EngineProcess` over
`build_engine_and_card` in a real child. Calls use picklable functions
(operator.attrgetter), as the server's must for the process.
"""

from __future__ import annotations

import asyncio
import operator

import pytest

from tokenfair.core.request import FinishReason, Request, SamplingParams
from tokenfair.engine.async_engine import AsyncEngine
from tokenfair.engine.engine_client import EngineClient, EngineDeadError
from tokenfair.engine.engine_process import EngineProcess
from tokenfair.server.model import build_engine_and_card, build_served_model

USED_BLOCKS = operator.attrgetter("scheduler.kv.num_used_blocks")
RUNNING = operator.attrgetter("scheduler.running")
KINDS = ["thread", "process"]


def start(kind: str, step_s: float = 0.0, **options: object) -> EngineClient:
    """A started engine of `kind`; call on the running loop."""
    build = {"policy": "vtc", **options}
    engine: EngineClient
    if kind == "thread":
        served = build_served_model(f"sim:fixed:{step_s}", **build)  # type: ignore[arg-type]
        assert served.engine is not None
        engine = AsyncEngine(served.engine)
    else:
        engine = EngineProcess.launch(
            build_engine_and_card, {"spec": f"sim:fixed:{step_s}", **build}
        )
    engine.start()
    return engine


def request(engine: EngineClient, rid: str, max_tokens: int, client: str = "a") -> Request:
    return Request(rid, client, 4, engine.now(), sampling=SamplingParams(max_tokens=max_tokens))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_gets_every_token_then_its_end(kind):
    async def main() -> tuple[list, Request]:  # type: ignore[type-arg]
        engine = start(kind)
        stream = engine.submit(request(engine, "r", 5))
        assert await stream.accepted
        outputs = [o async for o in stream]
        await engine.stop()
        return outputs, stream.request

    outputs, seen = run(main())
    assert sum(len(o.new_token_ids) for o in outputs) == 5
    assert "".join(o.new_text for o in outputs) == " tok" * 5
    assert outputs[-1].finished and outputs[-1].finish_reason is FinishReason.LENGTH
    # What the server reads of the request (for the process: mirrored from the engine's).
    assert len(seen.output_token_ids) == 5
    assert seen.first_token_s is not None and seen.finish_s is not None
    assert seen.arrival_s <= seen.first_token_s <= seen.finish_s


@pytest.mark.parametrize("kind", KINDS)
def test_an_abort_is_honoured_before_the_next_step_and_frees_the_blocks(kind):
    async def main() -> tuple[int, int, int, FinishReason | None]:
        engine = start(kind, step_s=0.005)
        stream = engine.submit(request(engine, "r", 10_000))
        await stream.accepted
        await stream.next_batch()  # running now
        assert await engine.call(USED_BLOCKS) > 0
        engine.abort("r")
        seen = sum([len(o.new_token_ids) async for o in stream])
        blocks = await engine.call(USED_BLOCKS)
        running = len(await engine.call(RUNNING))
        await engine.stop()
        return seen, blocks, running, stream.finish_reason

    seen, blocks, running, reason = run(main())
    assert seen < 50
    assert blocks == 0 and running == 0
    assert reason is FinishReason.ABORT


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_request_resolves_accepted_false_and_says_why(kind):
    async def main() -> tuple[bool, bool, FinishReason | None]:
        engine = start(kind, kv_tokens=64)
        stream = engine.submit(request(engine, "big", 500))
        accepted = await stream.accepted
        await engine.stop()
        return accepted, stream.done, stream.finish_reason

    assert run(main()) == (False, True, FinishReason.REJECTED)


@pytest.mark.parametrize("kind", KINDS)
def test_calls_return_results_and_raise_the_engines_errors(kind):
    async def main() -> None:
        engine = start(kind, max_num_seqs=8)
        assert await engine.call(operator.attrgetter("scheduler.config.max_num_seqs")) == 8
        with pytest.raises(AttributeError):
            await engine.call(operator.attrgetter("no_such_thing"))
        await engine.stop()
        assert not engine.alive
        with pytest.raises(EngineDeadError):
            engine.submit(request(engine, "late", 1))

    run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_many_concurrent_streams_finish(kind):
    async def main() -> int:
        engine = start(kind, max_num_seqs=64, kv_tokens=65536)
        streams = [
            engine.submit(request(engine, f"r{i}", 20, client=f"c{i % 4}")) for i in range(200)
        ]

        async def drain(stream) -> int:  # type: ignore[no-untyped-def]
            return sum([len(o.new_token_ids) async for o in stream])

        counts = await asyncio.gather(*(drain(s) for s in streams))
        await engine.stop()
        return sum(counts)

    assert run(main()) == 200 * 20


@pytest.mark.parametrize("kind", KINDS)
def test_stopping_ends_the_streams_in_flight_as_aborted(kind):
    async def main() -> list[FinishReason | None]:
        engine = start(kind, step_s=0.002)
        streams = [engine.submit(request(engine, f"r{i}", 10_000)) for i in range(3)]
        assert all([await s.accepted for s in streams])
        for stream in streams:
            await stream.next_batch()  # running
        for request_id in list(engine.streams):  # what the server does on shutdown
            engine.abort(request_id)
        await engine.stop()
        await asyncio.sleep(0.05)  # a thread's last callback runs on the loop
        assert all(s.done for s in streams)
        return [s.finish_reason for s in streams]

    assert run(main()) == [FinishReason.ABORT] * 3
