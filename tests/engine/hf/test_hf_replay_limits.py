"""The real-model trace replay honours a trace's max_tokens as the simulator does: the
request's limit (what reserve admission reserves) is `max_tokens`, and it stops at the
trace's `output_tokens`."""

from __future__ import annotations

from tokenfair.engine.hf.factory import make_hf_engine
from tokenfair.engine.hf.replay import replay_trace, trace_requests
from tokenfair.engine.sim.simulator import request_from_trace
from tokenfair.workloads.trace import TraceRecord

from .hf_models import loaded

TRACE = [
    TraceRecord(0.0, "a", 6, 3, "r0", max_tokens=12),
    TraceRecord(0.0, "b", 5, 4, "r1"),
]


def test_replay_requests_have_the_simulators_limits_and_lengths():
    for real, simulated in zip(
        trace_requests(TRACE, vocab_size=100), map(request_from_trace, TRACE), strict=True
    ):
        assert real.max_tokens == simulated.max_tokens
        assert real.target_output_tokens == simulated.target_output_tokens
    assert [r.max_tokens for r in trace_requests(TRACE, vocab_size=100)] == [12, 4]


def test_a_real_model_replay_generates_the_trace_lengths_under_a_larger_limit():
    model = loaded("llama")
    engine = make_hf_engine(model, kv_tokens=256, block_size=4, admission="reserve")
    result = replay_trace(engine, TRACE, vocab_size=model.model.config.vocab_size)
    assert [r.output_tokens for r in result.results] == [3, 4]
    assert [r.finish_reason for r in result.results] == ["stop", "stop"]
