"""Routing in one process: prefix keys, the per-upstream index, the router's choices, and
the fair order, which routing must leave as it is (the gateway's own admission queue,
counter store and upstream pool, with no network)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfair.gateway.config import HealthConfig, RoutingConfig, UpstreamConfig
from tokenfair.gateway.flow.admission import Admission
from tokenfair.gateway.flow.fairness import CounterFairness
from tokenfair.gateway.flow.order import by_priority
from tokenfair.gateway.flow.ticket import Ticket, TicketState
from tokenfair.gateway.replicas.counters import MemoryCounterStore
from tokenfair.gateway.upstreams.pool import Upstream, UpstreamPool
from tokenfair.gateway.upstreams.prefix import PrefixIndex, prefix_key
from tokenfair.gateway.upstreams.routing import (
    AFFINITY,
    FIRST_PLACEMENT,
    LEAST_LOADED,
    OVERLOAD_DIVERSION,
    PrefixAffinityRouter,
)

SYSTEM = "You answer questions about the tax code of a small country, citing articles. " * 12
AFFINE = RoutingConfig(mode="prefix-affinity", block_bytes=64)


def chat(*turns: str, system: str = SYSTEM) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": "system", "content": system}] + [
        {"role": roles[i % 2], "content": text} for i, text in enumerate(turns)
    ]


def vtc_admission(p: UpstreamPool) -> Admission:
    """The gateway's admission loop under VTC, its counters in this process."""
    fairness = CounterFairness(MemoryCounterStore(), by_priority)
    return Admission(p, lambda band: fairness)


def pool(
    names: list[str], routing: RoutingConfig = AFFINE, max_concurrent: int = 4
) -> UpstreamPool:
    configs = [
        UpstreamConfig(url=f"http://127.0.0.1:{9000 + i}", name=name, models=["m"],
                       max_concurrent=max_concurrent)
        for i, name in enumerate(names)
    ]  # fmt: skip
    return UpstreamPool(configs, HealthConfig(), routing=routing)


def send(p: UpstreamPool, tenant: str, messages: Any, tokens: int = 100) -> Upstream:
    """Route one request and hold its slot, as a dispatch does."""
    key = p.router.key(tenant, "m", "chat", messages)
    upstream = p.choose("m", tokens, prefix=key)
    assert upstream is not None
    upstream.acquire(tokens)
    return upstream


def decisions(p: UpstreamPool) -> dict[str, int]:
    total: dict[str, int] = {}
    for stats in p.router.stats.values():
        for reason, n in stats.decisions.items():
            total[reason] = total.get(reason, 0) + n
    return total


# --- keys and the index ---
def test_a_longer_conversation_extends_the_chain_of_the_shorter() -> None:
    short = prefix_key("t", "m", "chat", chat("What is article 4?"), 64, 64)
    long = prefix_key("t", "m", "chat", chat("What is article 4?", "It says...", "And 5?"), 64, 64)
    assert short is not None and long is not None and len(short.chain) >= SYSTEM.count(".")
    assert long.chain[: len(short.chain)] == short.chain
    assert len(long.chain) > len(short.chain)
    other_tenant = prefix_key("u", "m", "chat", chat("What is article 4?"), 64, 64)
    other_model = prefix_key("t", "m2", "chat", chat("What is article 4?"), 64, 64)
    assert other_tenant is not None and other_model is not None
    assert not set(other_tenant.chain) & set(short.chain)  # caches are per tenant
    assert not set(other_model.chain) & set(short.chain)
    capped = prefix_key("t", "m", "chat", chat("x"), 64, 3)
    assert capped is not None and capped.chain == short.chain[:3]


def test_prompts_text_ids_and_short_ones() -> None:
    text = prefix_key("t", "m", "completions", "abc " * 40, 16, 64)
    assert text is not None and len(text.chain) == 10
    ids = prefix_key("t", "m", "completions", list(range(100)), 16, 64)
    more = prefix_key("t", "m", "completions", list(range(120)), 16, 64)
    assert ids is not None and more is not None and more.chain[: len(ids.chain)] == ids.chain
    short = prefix_key("t", "m", "completions", "hi", 16, 64)
    assert short is not None and short.chain == [] and short.first == b"hi"
    assert prefix_key("t", "m", "completions", "", 16, 64) is None


@given(
    chains=st.lists(st.integers(1, 12), min_size=1, max_size=40),
    capacity=st.integers(1, 30),
)
@settings(max_examples=200, deadline=None)
def test_the_index_is_bounded_and_keeps_prefixes_of_chains(
    chains: list[int], capacity: int
) -> None:
    """Recorded chains of a tree of prefixes: after any eviction the index still holds a
    prefix of every chain, so the binary search finds what a linear walk finds."""
    rng = random.Random(len(chains) * 31 + capacity)
    index = PrefixIndex(capacity)
    recorded: list[list[int]] = []
    for length in chains:
        base = rng.choice(recorded) if recorded and rng.random() < 0.7 else []
        chain = base[: rng.randint(0, len(base))] + [rng.getrandbits(60) for _ in range(length)]
        index.record(chain)
        recorded.append(chain)
        assert len(index) <= capacity
        for seen in recorded:
            linear = 0
            while linear < len(seen) and seen[linear] in index._blocks:
                linear += 1
            assert index.match(seen) == linear
            assert all(block not in index._blocks for block in seen[linear:])
    assert index.match(recorded[-1]) == min(len(recorded[-1]), capacity)


# --- the router ---
def test_a_tenants_conversation_stays_on_one_upstream() -> None:
    """One turn at a time (each done before the next), as a conversation goes."""
    p = pool(["a", "b", "c"])
    first = send(p, "t", chat("Q1"))
    first.release(100)
    for i in range(2, 8):
        assert send(p, "t", chat("Q1", "A1", f"Q{i}")) is first
        first.release(100)
    assert decisions(p) == {FIRST_PLACEMENT: 1, AFFINITY: 6, OVERLOAD_DIVERSION: 0, LEAST_LOADED: 0}
    stats = p.router.stats[first.name]
    assert 0 < stats.matched < stats.blocks


def test_least_loaded_spreads_the_same_conversation() -> None:
    p = pool(["a", "b", "c"], RoutingConfig(mode="least-loaded"))
    used = {send(p, "t", chat("Q1", "A1", f"Q{i}")).name for i in range(3)}
    assert used == {"a", "b", "c"}
    assert decisions(p)[LEAST_LOADED] == 3


def test_an_upstream_past_the_bound_is_passed_over_and_nothing_waits() -> None:
    # 4 slots each: the bound 0.25 lets the preferred upstream be one request ahead.
    p = pool(["a", "b", "c"])
    home = send(p, "t", chat("Q"))
    assert send(p, "t", chat("Q", "A", "Q2")) is home  # 1/4 ahead: within the bound
    elsewhere = send(p, "t", chat("Q", "A", "Q3"))  # 2/4 ahead: diverted to the emptiest
    assert elsewhere is not home and elsewhere.running == 1
    assert decisions(p)[OVERLOAD_DIVERSION] == 1
    # Work conservation: while any upstream has room, every request is placed.
    placed = [send(p, "t", chat("Q", "A", f"Q{i}")) for i in range(9)]
    assert sorted(u.running for u in p.upstreams) == [4, 4, 4] and len(placed) == 9
    assert p.choose("m", 100, prefix=p.router.key("t", "m", "chat", chat("Q"))) is None


def test_a_bound_of_one_keeps_affinity_until_the_upstream_is_full() -> None:
    p = pool(["a", "b", "c"], RoutingConfig(mode="prefix-affinity", overload_bound=1.0))
    home = send(p, "t", chat("Q"))
    assert all(send(p, "t", chat("Q", "A", f"Q{i}")) is home for i in range(3))
    assert send(p, "t", chat("Q", "A", "Q9")) is not home  # full: never waits for it


def test_diverted_conversations_continue_where_they_went() -> None:
    """After a diversion the conversation is on two upstreams; the next turn goes to
    the one within the bound, still as affinity (it holds the longest prefix)."""
    p = pool(["a", "b", "c"])
    home = send(p, "t", chat("Q"))
    send(p, "t", chat("Q", "A", "Q2"))
    other = send(p, "t", chat("Q", "A", "Q3"))
    assert other is not home
    home.release(100)
    home.release(100)
    home.acquire(100)
    home.acquire(100)
    home.acquire(100)  # home 3/4, other 1/4: home is past the bound
    nxt = send(p, "t", chat("Q", "A", "Q3", "A3", "Q4"))
    assert nxt is other
    assert p.router.stats[other.name].decisions[AFFINITY] == 1


def test_new_prefixes_spread_and_replicas_agree_on_their_home() -> None:
    """Rendezvous placement from names alone: two routers with the upstreams listed in
    different orders (two gateway replicas) place every new prefix alike, and the
    prefixes spread over the upstreams."""
    first = pool(["a", "b", "c"])
    second = pool(["c", "a", "b"])
    homes = []
    for i in range(30):
        messages = chat("hello", system=f"System prompt number {i}. " * 8)
        a, b = send(first, f"tenant-{i % 4}", messages), send(second, f"tenant-{i % 4}", messages)
        assert a.name == b.name
        homes.append(a.name)
        a.release(100)
        b.release(100)
    assert set(homes) == {"a", "b", "c"}
    assert decisions(first)[FIRST_PLACEMENT] == 30


def test_an_upstream_out_of_rotation_is_forgotten() -> None:
    p = pool(["a", "b"])
    home = send(p, "t", chat("Q"))
    router = p.router
    assert isinstance(router, PrefixAffinityRouter) and len(router.index(home.name)) > 0
    for _ in range(p.health.fail_after):
        p.mark_failure(home, "test")
    assert not home.healthy and len(router.index(home.name)) == 0


# --- the fair order ---
async def _dispatch_order(routing: RoutingConfig) -> tuple[list[str], dict[str, int]]:
    """Tenants' requests queued behind full upstreams, then capacity freed two slots at a
    time: the order in which the tenants were dispatched, and the routing decisions."""
    p = pool(["a", "b", "c"], routing, max_concurrent=2)
    admission = vtc_admission(p)
    admission.start()
    tickets: list[Ticket] = []
    waits: list[asyncio.Task[Upstream]] = []

    def arrive(tenant: str, question: str, prompt: int) -> None:
        system = SYSTEM if tenant != "light" else "Short system prompt. " * 12
        ticket = Ticket(
            tenant=tenant, model="m", tokens=prompt + 16, charge=((tenant, float(prompt)),),
            max_tokens=16,
            prefix=p.router.key(tenant, "m", "chat", chat(question, system=system)),
        )  # fmt: skip
        tickets.append(ticket)
        waits.append(asyncio.ensure_future(admission.wait(ticket)))

    for i in range(6):  # fills the 6 slots
        arrive("hog", f"hog {i}", 50)
        await asyncio.sleep(0)
    rng = random.Random(7)
    for i in range(40):
        tenant = rng.choice(["heavy", "heavy", "heavy", "light", "other"])
        arrive(tenant, f"question {i}", rng.randint(20, 400))
        await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    running = [t for t in tickets if t.state is TicketState.DISPATCHED]
    assert len(running) == 6
    while any(t.state is TicketState.DISPATCHED for t in tickets):
        done = [t for t in tickets if t.state is TicketState.DISPATCHED][:2]
        for ticket in done:  # two slots free at once: the router has a choice
            admission.release(ticket)
        for _ in range(10):
            await asyncio.sleep(0)
    await asyncio.gather(*waits)
    await admission.close()
    order = [row["tenant"] for row in admission.recent]
    return order, decisions(p)


def test_routing_leaves_the_fair_order_between_tenants_unchanged() -> None:
    least_order, least = asyncio.run(_dispatch_order(RoutingConfig(mode="least-loaded")))
    affine_order, affine = asyncio.run(_dispatch_order(AFFINE))
    assert len(least_order) == 46
    assert affine_order == least_order
    # ... while the routing itself did differ.
    assert least[LEAST_LOADED] == 46 and affine[LEAST_LOADED] == 0
    assert affine[AFFINITY] > 0


@pytest.mark.parametrize("mode", ["least-loaded", "prefix-affinity"])
def test_a_request_only_waits_when_no_upstream_has_room(mode: str) -> None:
    async def run() -> int:
        p = pool(["a", "b"], RoutingConfig(mode=mode), max_concurrent=3)  # type: ignore[arg-type]
        admission = vtc_admission(p)
        admission.start()
        waits = []
        for i in range(8):
            ticket = Ticket(
                tenant="t", model="m", tokens=100, charge=(("t", 10.0),),
                prefix=p.router.key("t", "m", "chat", chat(f"Q{i}")),
            )  # fmt: skip
            waits.append(asyncio.ensure_future(admission.wait(ticket)))
            await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)
        waiting = admission.num_waiting
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        await admission.close()
        return waiting

    assert asyncio.run(run()) == 2  # 6 slots, 8 requests
