"""The engine loop with a scripted executor: stop strings, streaming, abort, outputs."""

from __future__ import annotations

import pytest

from tokenfair.core.batch import ExecutorOutput, SchedulerOutput
from tokenfair.core.policies import make_policy
from tokenfair.core.request import FinishReason, Request, SamplingParams
from tokenfair.core.scheduler import Scheduler, SchedulerConfig
from tokenfair.engine.clock import VirtualClock
from tokenfair.engine.engine import Engine

EOS = 0


class ScriptedExecutor:
    """Each request emits the token ids of its script, one per step, then EOS."""

    def __init__(self, scripts: dict[str, list[int]]):
        self.scripts = scripts

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        sampled = {}
        for s in batch.scheduled:
            if s.samples:
                script = self.scripts[s.request.request_id]
                k = len(s.request.output_token_ids)
                sampled[s.request.request_id] = script[k] if k < len(script) else EOS
        return ExecutorOutput(sampled=sampled, elapsed_s=0.01)


class TableDetokenizer:
    """Token id -> text, from a table; remembers who it has seen."""

    def __init__(self, table: dict[int, str]):
        self.table = table
        self.seen: set[str] = set()

    def new_text(self, request_id: str, output_token_ids: list[int]) -> str:
        self.seen.add(request_id)
        return self.table.get(output_token_ids[-1], "")

    def forget(self, request_id: str) -> None:
        self.seen.discard(request_id)


TABLE = {1: "hel", 2: "lo ", 3: "E", 4: "ND", 5: "abcd", 6: "x", 7: "more"}


def run(script: list[int], stop: tuple[str, ...], max_tokens: int = 20):
    detokenizer = TableDetokenizer(TABLE)
    scheduler = Scheduler(SchedulerConfig(kv_tokens=256, block_size=4), make_policy("fcfs"))
    engine = Engine(scheduler, ScriptedExecutor({"r": script}), VirtualClock(), detokenizer)
    request = Request(
        "r",
        "a",
        input_tokens=3,
        arrival_s=0.0,
        prompt_token_ids=[9, 9, 9],
        sampling=SamplingParams(max_tokens=max_tokens, stop=stop),
        eos_token_ids=frozenset({EOS}),
    )
    engine.add_request(request)
    streamed = ""
    while engine.has_unfinished():
        for output in engine.step():
            streamed += output.new_text
    return request, streamed, detokenizer


def test_stop_string_straddling_tokens_is_never_streamed():
    request, streamed, detokenizer = run([1, 2, 3, 4, 7], stop=("END",))
    assert request.output_text == streamed == "hello "
    assert request.finish_reason is FinishReason.STOP
    assert not detokenizer.seen  # forgotten once finished


def test_earliest_stop_wins_whatever_the_order_of_stops():
    request, streamed, _ = run([6, 5], stop=("cd", "ab"))
    assert request.output_text == streamed == "x"


def test_stop_string_on_the_last_allowed_token_still_stops_and_is_cut():
    request, streamed, _ = run([1, 2, 3, 4], stop=("END",), max_tokens=4)
    assert request.output_text == streamed == "hello "
    assert request.finish_reason is FinishReason.STOP


def test_held_back_text_is_released_at_finish():
    request, streamed, _ = run([1, 2, 3], stop=("END",))
    assert request.finish_reason is FinishReason.STOP  # EOS after "hello E"
    assert request.output_text == streamed == "hello E"


def test_without_stops_text_streams_as_it_comes():
    request, streamed, _ = run([1, 2], stop=())
    assert streamed == request.output_text == "hello "


def test_empty_stop_strings_are_refused():
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=("",))


def test_abort_forgets_detokenizer_state_and_reports_the_request():
    detokenizer = TableDetokenizer(TABLE)
    scheduler = Scheduler(SchedulerConfig(kv_tokens=256, block_size=4), make_policy("fcfs"))
    engine = Engine(scheduler, ScriptedExecutor({"r": [7] * 50}), VirtualClock(), detokenizer)
    engine.add_request(
        Request(
            "r",
            "a",
            input_tokens=2,
            arrival_s=0.0,
            prompt_token_ids=[1, 1],
            sampling=SamplingParams(max_tokens=50),
        )
    )
    engine.step()
    assert "r" in detokenizer.seen
    assert engine.abort("r")
    assert not detokenizer.seen
    outputs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outputs] == [
        ("r", True, FinishReason.ABORT)
    ]
    assert not engine.abort("r")  # already gone


def test_simulator_clock_starts_at_the_earliest_arrival_of_an_unsorted_trace():
    from tokenfair.engine.sim.profile import load_profile
    from tokenfair.engine.sim.simulator import simulate
    from tokenfair.workloads.trace import TraceRecord

    trace = [
        TraceRecord(
            arrival_s=100.0, client="a", input_tokens=5, output_tokens=5, request_id="late"
        ),
        TraceRecord(arrival_s=0.0, client="b", input_tokens=5, output_tokens=5, request_id="early"),
    ]
    result = simulate(trace, make_policy("fcfs"), load_profile("a10g-llama-7b"), SchedulerConfig())
    early = next(r for r in result.results if r.request_id == "early")
    assert early.first_token_s < 1.0
