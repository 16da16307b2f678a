"""End to end with vLLM's offline LLM: the plugin loaded by `scheduler_cls`, the model
run for real, the engine core in this process so the test can read its scheduler.

Stock vLLM is measured on the very same engine: between runs, when the engine is
idle, its scheduler is swapped for vLLM's own `Scheduler` built with the same
arguments. Same model runner, same KV cache, same process: only the scheduler
differs. `FairAsyncScheduler` (the plugin over vLLM's AsyncScheduler, for GPU builds)
runs on the same engine too, end to end with the real model. vLLM's CPU platform
turns async scheduling off, whatever is asked, so the engine drives it one step at a
time: its output placeholders and charges are exercised, the overlap of scheduling
with the model's step is not (the scheduler-level async tests and vLLM's own
async-scheduler tests, run with it substituted, cover that order of calls). Latencies and throughput are compared in engine steps (counts, not wall
time, which is too noisy on a shared machine; benchmarks/vllm_plugin.py measures wall
time).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import pytest
from vllm import LLM, SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler

from tests.integrations.vllm.tiny_model import prompt_ids
from tokenfair.integrations.vllm import FairAsyncScheduler, FairScheduler

pytestmark = pytest.mark.slow

MAX_NUM_SEQS = 4
HEAVY = 16  # requests flooded at once, of staggered lengths so that seats free up often
HEAVY_PROMPT = 64


def heavy_output(i: int) -> int:
    return 24 + (13 * i) % 48


LIGHT = 6  # requests sent one after another
LIGHT_PROMPT, LIGHT_OUTPUT = 32, 8


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    engine = LLM(
        model=tiny_model_dir,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=MAX_NUM_SEQS,
        enable_prefix_caching=False,
        scheduler_cls="tokenfair.integrations.vllm.FairScheduler",
        additional_config={"tokenfair": {"policy": "vtc", "log_interval_s": 0}},
        seed=0,
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()


def engine_core(llm):
    return llm.llm_engine.engine_core.engine_core


@pytest.fixture(scope="module")
def schedulers(llm):
    """{"plugin": the FairScheduler vLLM loaded, "stock": vLLM's Scheduler alike,
    "async": FairAsyncScheduler alike}."""
    plugin = engine_core(llm).scheduler
    assert isinstance(plugin, FairScheduler)

    def alike(cls):
        return cls(
            vllm_config=plugin.vllm_config,
            kv_cache_config=plugin.kv_cache_config,
            structured_output_manager=plugin.structured_output_manager,
            block_size=plugin.block_size,
            hash_block_size=plugin.hash_block_size if hasattr(plugin, "hash_block_size") else None,
            include_finished_set=plugin.finished_req_ids_dict is not None,
            log_stats=plugin.log_stats,
        )

    return {"plugin": plugin, "stock": alike(Scheduler), "async": alike(FairAsyncScheduler)}


def use(llm, scheduler) -> None:
    core = engine_core(llm)
    assert not core.scheduler.has_requests(), "swap schedulers only when idle"
    core.scheduler = scheduler


def drain(llm) -> None:
    """Step until the scheduler has told the runner about every finished request."""
    while engine_core(llm).scheduler.has_requests():
        llm.llm_engine.step()


@dataclass
class Run:
    added: dict[str, int] = field(default_factory=dict)  # request id -> step added
    first: dict[str, int] = field(default_factory=dict)  # step of the first token
    done: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    steps: int = 0

    def ttft_steps(self, prefix: str) -> list[int]:
        return [self.first[r] - self.added[r] for r in self.added if r.startswith(prefix)]

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.tokens.values())


def flood(llm, scheduler) -> Run:
    """The heavy tenant floods; the light one sends its next request when one ends."""
    use(llm, scheduler)
    engine = llm.llm_engine
    run = Run()

    def submit(request_id: str, tenant: str, prompt: int, output: int, seed: int) -> None:
        params = SamplingParams(
            max_tokens=output, temperature=0.0, ignore_eos=True, extra_args={"tenant": tenant}
        )
        engine.add_request(request_id, {"prompt_token_ids": prompt_ids(prompt, seed)}, params)
        run.added[request_id] = run.steps

    for i in range(HEAVY):
        submit(f"heavy-{i}", "heavy", HEAVY_PROMPT, heavy_output(i), seed=i)
    light_sent = 0
    submit(f"light-{light_sent}", "light", LIGHT_PROMPT, LIGHT_OUTPUT, seed=1000)
    light_sent += 1
    while engine.has_unfinished_requests():
        outputs = engine.step()
        run.steps += 1
        for out in outputs:
            rid = out.request_id
            ids = list(out.outputs[0].token_ids)
            if ids and rid not in run.first:
                run.first[rid] = run.steps
            run.tokens[rid] = ids
            if out.finished:
                run.done[rid] = run.steps
                if rid.startswith("light") and light_sent < LIGHT:
                    submit(
                        f"light-{light_sent}",
                        "light",
                        LIGHT_PROMPT,
                        LIGHT_OUTPUT,
                        1000 + light_sent,
                    )
                    light_sent += 1
    drain(llm)
    return run


@pytest.fixture(scope="module")
def flood_runs(llm, schedulers):
    return {name: flood(llm, scheduler) for name, scheduler in schedulers.items()}


def p90(values: list[int]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def test_plugin_is_loaded_by_scheduler_cls(llm, schedulers):
    assert type(engine_core(llm).scheduler) in (FairScheduler, Scheduler)
    assert schedulers["plugin"].tokenfair_config.policy == "vtc"


@pytest.mark.parametrize("variant", ["plugin", "async"])
def test_light_tenant_ttft_under_a_flood(flood_runs, variant):
    plugin, stock = flood_runs[variant], flood_runs["stock"]
    assert len(plugin.done) == len(stock.done) == HEAVY + LIGHT
    light_plugin, light_stock = p90(plugin.ttft_steps("light")), p90(stock.ttft_steps("light"))
    print(f"light TTFT p90 in steps: {variant} {light_plugin}, stock {light_stock}")
    # Stock FCFS queues the light request behind the flood; VTC lets it in next.
    assert light_stock >= 10
    assert light_plugin <= 0.3 * light_stock, (light_plugin, light_stock)


@pytest.mark.parametrize("variant", ["plugin", "async"])
def test_throughput_is_kept(flood_runs, variant):
    plugin, stock = flood_runs[variant], flood_runs["stock"]
    expected = sum(map(heavy_output, range(HEAVY))) + LIGHT * LIGHT_OUTPUT
    assert plugin.output_tokens == stock.output_tokens == expected
    print(f"steps: {variant} {plugin.steps}, stock {stock.steps}")
    # Output tokens per engine step: the same work in (nearly) as few steps.
    assert plugin.output_tokens / plugin.steps >= 0.95 * stock.output_tokens / stock.steps


@pytest.mark.parametrize("variant", ["plugin", "async"])
def test_greedy_outputs_identical_with_and_without_the_plugin(flood_runs, variant):
    assert flood_runs[variant].tokens == flood_runs["stock"].tokens


@pytest.mark.parametrize("variant", ["plugin", "async"])
def test_counters_after_the_flood(flood_runs, schedulers, variant):
    stats = schedulers[variant].driver.tenants()
    assert stats["heavy"].prompt_tokens == HEAVY * HEAVY_PROMPT
    assert stats["heavy"].output_tokens == sum(map(heavy_output, range(HEAVY)))
    assert stats["light"].output_tokens == LIGHT * LIGHT_OUTPUT
    assert all(s.waiting == s.running == 0 for s in stats.values())
    # The heavy tenant arrived first, to an idle engine (no lift): its counter is
    # exactly its prompts and twice its outputs.
    assert schedulers[variant].driver.counters()["heavy"] == HEAVY * HEAVY_PROMPT + 2 * sum(
        map(heavy_output, range(HEAVY))
    )


def test_generate_api_greedy_identical(llm, schedulers):
    """LLM.generate with tenants in extra_args: same tokens under either scheduler."""
    prompts = [{"prompt_token_ids": prompt_ids(16 + 8 * i, 500 + i)} for i in range(6)]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, extra_args={"tenant": f"t{i % 3}"})
        for i in range(6)
    ]
    results = {}
    for name in ("stock", "plugin", "async"):
        use(llm, schedulers[name])
        outputs = llm.generate(prompts, params, use_tqdm=False)
        drain(llm)
        results[name] = [list(o.outputs[0].token_ids) for o in outputs]
    assert results["plugin"] == results["async"] == results["stock"]
    assert set(schedulers["plugin"].driver.counters()) >= {"t0", "t1", "t2"}
