"""Random mixes of tenants: seeded, heavy and light roles in their ranges, and
`tokenfair trace gen mix`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tokenfair.cli import app
from tokenfair.engine.sim.profile import load_profile
from tokenfair.workloads.mixes import (
    HEAVY_OUTPUT,
    HEAVY_OVER_SHARE,
    LIGHT_OUTPUT,
    LIGHT_PROMPT,
    LIGHT_RATE,
    PROFILES,
    MixError,
    random_mix,
    request_seconds,
)
from tokenfair.workloads.trace import read_trace

SEEDS = range(40)


def within(pair: tuple[int, int], bounds: tuple[int, int]) -> bool:
    return bounds[0] <= pair[0] <= pair[1] <= bounds[1]


def test_a_mix_is_its_seed():
    assert random_mix(5, "h200") == random_mix(5, "h200")
    assert random_mix(5).records != random_mix(6).records
    # The same tenants on both profiles; only the rates and heavy prompts follow it.
    a10g, h200 = random_mix(5, "a10g").spec, random_mix(5, "h200").spec
    assert [(t.name, t.weight, t.output) for t in a10g.tenants] == [
        (t.name, t.weight, t.output) for t in h200.tenants
    ]
    assert [t.prompt for t in a10g.light] == [t.prompt for t in h200.light]


@pytest.mark.parametrize("profile", list(PROFILES))
def test_heavy_and_light_tenants_in_their_ranges(profile):
    gpu = PROFILES[profile]
    step_profile = load_profile(gpu.step_profile)
    weighted = 0
    for seed in SEEDS:
        mix = random_mix(seed, profile)
        spec = mix.spec
        assert 1 <= len(spec.heavy) <= 3 and 2 <= len(spec.light) <= 5
        assert [t.name for t in spec.tenants] == [f"heavy-{i}" for i in range(len(spec.heavy))] + [
            f"light-{i}" for i in range(len(spec.light))
        ]
        assert 100 <= spec.duration_s <= 120
        assert all(t.weight in (1, 2, 3, 4) for t in spec.tenants)
        weighted += spec.weighted
        assert (mix.weights is None) == (not spec.weighted)
        total_weight = sum(t.weight for t in spec.tenants)
        loads = 0.0
        for t in spec.heavy:
            assert within(t.prompt, gpu.heavy_prompt) and within(t.output, HEAVY_OUTPUT)
            load = t.rate * request_seconds(step_profile, gpu.kv_tokens, t.prompt, t.output)
            # Each heavy tenant over its weighted share of the GPU's time (rates rounded).
            assert load >= 0.999 * HEAVY_OVER_SHARE * t.weight / total_weight
            loads += load
        assert loads == pytest.approx(spec.overload) and spec.overload >= 1.499
        low, high = (rate * gpu.light_rate_scale for rate in LIGHT_RATE)
        for t in spec.light:
            assert within(t.prompt, LIGHT_PROMPT) and within(t.output, LIGHT_OUTPUT)
            assert low - 1e-4 <= t.rate <= high + 1e-4
        by_name = {t.name: t for t in spec.tenants}
        assert {r.client for r in mix.records} <= set(by_name)
        for r in mix.records:
            t = by_name[r.client]
            assert t.prompt[0] <= r.input_tokens <= t.prompt[1]
            assert t.output[0] <= r.output_tokens <= t.output[1]
            assert 0 <= r.arrival_s < spec.duration_s
        assert [r.arrival_s for r in mix.records] == sorted(r.arrival_s for r in mix.records)
    assert 10 <= weighted <= 30  # about half of the mixes are weighted
    assert (
        profile != "h200"
        or min(random_mix(s, profile).spec.heavy[0].prompt[0] for s in SEEDS) >= 16_000
    )


def test_a_light_tenant_alone_is_its_requests_in_the_mix():
    mix = random_mix(2)
    alone = mix.alone("light-1")
    assert alone and all(r.client == "light-1" for r in alone)
    assert len(alone) == sum(r.client == "light-1" for r in mix.records)
    short = mix.until(30.0)
    assert short.spec.duration_s == 30.0 and max(r.arrival_s for r in short.records) < 30.0


def test_bad_seeds_and_profiles_say_what_to_give():
    with pytest.raises(MixError, match="whole number >= 0"):
        random_mix(-1)
    with pytest.raises(MixError, match="known: a10g, h200"):
        random_mix(1, "a100")


runner = CliRunner()


def test_trace_gen_mix_writes_a_trace_its_weights_and_its_tenants(tmp_path):
    out, weights = tmp_path / "mix.jsonl", tmp_path / "w.json"
    args = ["trace", "gen", "mix", "--seed", "1", "--profile", "h200", "--out", str(out)]
    result = runner.invoke(app, [*args, "--weights-out", str(weights)])
    assert result.exit_code == 0, result.output
    records = read_trace(out)
    mix = random_mix(1, "h200")
    assert records == list(mix.records)
    printed = json.loads(result.stdout)
    assert printed["requests"] == len(records) and printed["mix"] == mix.spec.to_json()
    assert json.loads(weights.read_text()) == mix.spec.weights
    roles = {t["name"]: t["role"] for t in printed["mix"]["tenants"]}
    assert set(roles.values()) == {"heavy", "light"}


def test_trace_gen_mix_refuses_bad_options(tmp_path):
    out = str(tmp_path / "m.jsonl")
    for args, message in (
        (["mix", "--profile", "a100"], "expected one of a10g, h200"),
        (["overload", "--profile", "h200"], "--profile is an option of the mix workload"),
        (["mix", "--skew", "1"], "--skew is an option of the documents workload"),
    ):
        result = runner.invoke(app, ["trace", "gen", *args, "--out", out])
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
        assert not (tmp_path / "m.jsonl").exists()
    result = runner.invoke(app, ["trace", "gen", "--list"])
    assert "mix" in result.output
