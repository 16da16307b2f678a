import pytest

from tokenfair.core.kv_cache import KVCacheManager

from .helpers import make_request


def take_prefix(kv: KVCacheManager, request) -> int:
    """Admit-style: look the request's cached prefix up and take it; its tokens."""
    hit = kv.lookup_prefix(request)
    assert kv.allocate(request, hit.num_tokens, hit) is not None
    return hit.num_tokens


def test_allocate_grows_by_whole_blocks_and_free_returns_them():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    r = make_request()
    assert kv.allocate(r, 5) == kv.block_table(r.request_id)
    assert len(kv.block_table(r.request_id)) == 2
    assert kv.allocate(r, 8)  # still fits in two blocks
    assert len(kv.block_table(r.request_id)) == 2
    assert kv.allocate(r, 9)
    assert kv.num_free_blocks == 7
    kv.free(r)
    assert kv.num_free_blocks == 10
    kv.check_invariants()


def test_allocate_refuses_without_taking_anything():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a, b = make_request(), make_request()
    assert kv.allocate(a, 8)
    assert kv.allocate(b, 8) is None
    assert kv.num_free_blocks == 1
    assert kv.blocks_needed(b, 8) == 2
    kv.check_invariants()


def test_recomputed_request_hits_its_own_freed_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    r = make_request(input_tokens=10)
    r.prompt_token_ids = list(range(10))
    assert kv.allocate(r, 10)
    r.num_computed_tokens = 10
    kv.cache_full_blocks(r)  # blocks 0 and 1 are full
    kv.free(r)  # preempted by recompute
    assert kv.num_free_blocks == 8
    assert take_prefix(kv, r) == 8
    assert len(kv.block_table(r.request_id)) == 2
    kv.check_invariants()


def test_simulated_requests_without_tokens_hash_by_identity():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    r, other = make_request(input_tokens=9), make_request(input_tokens=9)
    kv.allocate(r, 9)
    r.num_computed_tokens = 9
    kv.cache_full_blocks(r)
    kv.free(r)
    assert take_prefix(kv, other) == 0  # someone else's blocks are not ours
    kv.free(other)
    assert take_prefix(kv, r) == 8


def test_at_least_one_token_is_left_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    r = make_request(input_tokens=8)
    r.prompt_token_ids = list(range(8))
    kv.allocate(r, 8)
    r.num_computed_tokens = 8
    kv.cache_full_blocks(r)
    kv.free(r)
    assert take_prefix(kv, r) == 4  # the last block is recomputed to produce a token


def test_shared_prefix_blocks_are_reference_counted():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a, b = make_request(input_tokens=9), make_request(input_tokens=9)
    a.prompt_token_ids = list(range(9))
    b.prompt_token_ids = list(range(9))
    kv.allocate(a, 9)
    a.num_computed_tokens = 9
    kv.cache_full_blocks(a)
    assert take_prefix(kv, b) == 8
    assert kv.block_table(b.request_id) == kv.block_table(a.request_id)[:2]
    kv.free(a)
    assert kv.num_used_blocks == 2  # b still holds the shared blocks
    kv.free(b)
    kv.check_invariants()
    assert kv.num_free_blocks == 8


def test_cached_blocks_are_evicted_least_recently_freed_first():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    old, new = make_request(input_tokens=4), make_request(input_tokens=4)
    for r in (old, new):
        kv.allocate(r, 4)
        r.num_computed_tokens = 4
        kv.cache_full_blocks(r)
    kv.free(old)
    kv.free(new)
    filler = make_request(input_tokens=4)
    kv.allocate(filler, 4)  # takes the two evictable blocks freed first: old's
    kv.free(filler)
    assert take_prefix(kv, old) == 0
    kv.free(old)
    assert take_prefix(kv, new) == 2
    kv.check_invariants()


def test_swap_area_is_bounded_and_round_trips():
    kv = KVCacheManager(num_blocks=6, block_size=4, num_swap_blocks=3)
    a, b = make_request(), make_request()
    kv.allocate(a, 12)
    kv.allocate(b, 8)
    out = kv.swap_out(a)
    assert out is not None and len(out) == 3
    assert kv.num_free_swap_blocks == 0
    assert kv.swap_out(b) is None  # the swap area is full: never exceeded
    assert kv.num_free_blocks == 4
    back = kv.swap_in(a)
    assert back is not None and [s for s, _ in back] == [s for _, s in out]
    assert kv.num_free_swap_blocks == 3
    kv.free(a)
    kv.free(b)
    kv.check_invariants()
    assert kv.num_free_blocks == 6


def test_swap_in_waits_for_room():
    kv = KVCacheManager(num_blocks=2, block_size=4, num_swap_blocks=2)
    a, b = make_request(), make_request()
    kv.allocate(a, 8)
    kv.swap_out(a)
    kv.allocate(b, 5)
    assert kv.swap_in(a) is None
    kv.free(b)
    assert kv.swap_in(a) is not None


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=0)


def grouped(input_tokens: int, group: str | None, prefix_tokens: int = 0, **kw):
    request = make_request(input_tokens=input_tokens, **kw)
    request.prefix_group, request.prefix_tokens = group, prefix_tokens
    return request


def computed(kv: KVCacheManager, request, tokens: int) -> None:
    """Run `request` until `tokens` of it are computed (its full blocks cached)."""
    assert kv.allocate(request, tokens)
    request.num_computed_tokens = tokens
    kv.cache_full_blocks(request)


def test_requests_of_one_prefix_group_share_their_common_prefix():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = grouped(20, "a/system", 10)
    computed(kv, first, 20)
    kv.free(first)
    # The first 8 tokens (2 whole blocks) lie on the group's text in both prompts.
    same = grouped(30, "a/system", 12)
    assert kv.cached_prefix_blocks(same) == 2
    assert take_prefix(kv, same) == 8
    other_group = grouped(30, "b/system", 12)
    assert take_prefix(kv, other_group) == 0
    no_group = grouped(30, None)
    assert take_prefix(kv, no_group) == 0


def test_a_whole_prompt_on_its_group_continues_it_with_the_output():
    # A chat turn: its prompt is the conversation so far; the next turn's prompt starts
    # with that prompt and its answer, so both are cache hits.
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    turn = grouped(8, "conv", 8)
    turn.extend_output([1] * 8)
    computed(kv, turn, 16)
    kv.free(turn)
    next_turn = grouped(20, "conv", 20)
    assert take_prefix(kv, next_turn) == 16


def test_prefix_lookups_take_nothing_and_report_what_admission_would_use():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    first = grouped(12, "g", 12)
    computed(kv, first, 12)
    kv.free(first)  # 3 cached blocks, all evictable
    waiting = grouped(16, "g", 12)
    assert kv.cached_prefix_blocks(waiting) == 3
    assert kv.num_free_blocks == 8 and waiting.request_id not in kv.holders()
    # 3 idle cached blocks to take back (+ 1 new block for tokens 12..15).
    hit = kv.lookup_prefix(waiting)
    assert (len(hit.blocks), hit.num_tokens, hit.idle_blocks) == (3, 12, 3)
    assert kv.num_free_blocks == 8 and waiting.request_id not in kv.holders()
    holder = grouped(13, "g", 12)
    assert take_prefix(kv, holder) == 12  # now held: taking them costs no free block
    hit = kv.lookup_prefix(waiting)
    assert (len(hit.blocks), hit.idle_blocks) == (3, 0)


def test_listeners_hear_of_cached_blocks_and_wanted_evictions_are_counted():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    heard: list[list[int]] = []
    kv.on_cached.append(heard.append)
    request = grouped(8, "g", 8)
    computed(kv, request, 6)
    keys = kv.block_hashes(request, 3)
    assert heard == [keys]
    kv.free(request)
    kv.want(keys[:1])  # a waiting request will hit the first block
    filler = grouped(8, None)
    kv.allocate(filler, 6)  # one untouched block, then the two unwanted cached ones
    assert kv.wanted_evictions == 0 and kv.cached_prefix_blocks(request) == 1
    kv.allocate(filler, 8)  # only the wanted block is left to evict
    assert kv.wanted_evictions == 1 and kv.cached_prefix_blocks(request) == 0
    kv.unwant(keys[:1])
    kv.check_invariants()


def test_wanted_blocks_are_evicted_last():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    old, new = grouped(4, "old", 4), grouped(4, "new", 4)
    for r in (old, new):
        computed(kv, r, 4)
    kv.free(old)
    kv.free(new)
    kv.want(kv.block_hashes(old, 2))  # LRU would evict old's blocks first
    filler = grouped(4, None)
    kv.allocate(filler, 4)
    assert kv.cached_prefix_blocks(old) == 1  # matchable: (4 - 1) // 2 blocks
    assert kv.cached_prefix_blocks(new) == 0
    kv.check_invariants()


def kv_state(kv: KVCacheManager) -> tuple:
    """Everything a lookup must leave alone: tables, counts, hashes, both LRUs in order."""
    return (
        {rid: list(kv.block_table(rid)) for rid in kv.holders()},
        list(kv.pool._free),
        list(kv.pool.ref_count),
        list(kv.index.block_hash),
        dict(kv.index.cached),
        list(kv.pool._idle),
        list(kv.pool._idle_wanted),
        dict(kv.index.entered_blocks),
        kv.num_free_blocks,
        kv.wanted_evictions,
    )


def cached_pool() -> tuple[KVCacheManager, list[int]]:
    """8 blocks of 4: a held block, 3 idle cached blocks of group "g" (the first one
    wanted), and 4 untouched blocks; returns the manager and g's block hashes."""
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    computed(kv, grouped(4, None), 4)  # held all along
    first = grouped(12, "g", 12)
    computed(kv, first, 12)
    kv.free(first)
    keys = kv.block_hashes(first, 3)
    kv.want(keys[:1])
    return kv, keys


def test_lookup_prefix_takes_nothing():
    kv, keys = cached_pool()
    before = kv_state(kv)
    waiting = grouped(16, "g", 12)
    hit = kv.lookup_prefix(waiting)
    assert hit.num_tokens == 12 and hit.hashes == tuple(keys) and hit.idle_blocks == 3
    assert kv_state(kv) == before  # no reference count, LRU move or table
    assert waiting.request_id not in kv.holders() and waiting.num_computed_tokens == 0
    assert kv.lookup_prefix(waiting) == hit  # and so looking again finds the same
    kv.check_invariants()
    # A partly held prefix: only the idle blocks would come from the free pool.
    holder = grouped(5, "g", 4)
    assert kv.allocate(holder, 5, kv.lookup_prefix(holder)) is not None
    assert kv.lookup_prefix(waiting).idle_blocks == 2
    # Without prefix caching there is never a hit.
    plain = KVCacheManager(num_blocks=8, block_size=4)
    assert plain.lookup_prefix(waiting).num_tokens == 0


def test_touch_prefix_only_makes_the_idle_blocks_most_recently_used():
    kv, keys = cached_pool()  # g's first block wanted, the other two not
    other = grouped(5, "o", 4)
    computed(kv, other, 5)
    kv.free(other)
    g = [kv.index.cached[key] for key in keys]
    o = kv.index.cached[kv.block_hashes(other, 1)[0]]
    assert list(kv.pool._idle) == [g[2], g[1], o] and list(kv.pool._idle_wanted) == [g[0]]
    before = kv_state(kv)
    kv.touch_prefix(kv.lookup_prefix(grouped(16, "g", 12)))
    assert list(kv.pool._idle) == [o, g[2], g[1]]  # g's blocks now the newest
    assert list(kv.pool._idle_wanted) == [g[0]]  # a wanted block stays in its own LRU
    after = kv_state(kv)
    assert after[:5] + after[7:] == before[:5] + before[7:]  # nothing else changed
    kv.check_invariants()


def test_allocate_returns_the_table_or_none_and_takes_nothing_on_none():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a, b = make_request(), make_request()
    table = kv.allocate(a, 5)
    assert table == kv.block_table(a.request_id) and len(table) == 2
    assert kv.allocate(a, 9) is table and len(table) == 3  # grows the same list
    before = kv_state(kv)
    assert kv.allocate(b, 8) is None  # 2 blocks wanted, 1 free
    assert kv_state(kv) == before and b.request_id not in kv.holders()
    with pytest.raises(KeyError):
        kv.block_table(b.request_id)
    kv.check_invariants()


def test_idle_prefix_blocks_count_against_the_free_pool():
    kv, _ = cached_pool()  # 7 free: 4 untouched + 3 idle cached
    kv.allocate(grouped(4, None), 4)  # 6 free: 3 untouched + 3 idle cached
    waiting = grouped(24, "g", 12)
    hit = kv.lookup_prefix(waiting)
    assert hit.idle_blocks == 3
    before = kv_state(kv)
    # 28 tokens: 4 new blocks after the 3 cached ones. 4 new alone would fit the 6 free,
    # but taking the prefix takes its 3 idle blocks out of the free pool too.
    assert kv.allocate(waiting, 28, hit) is None  # 4 new + 3 idle > 6 free
    assert kv_state(kv) == before
    table = kv.allocate(waiting, 24, hit)  # 3 new + 3 idle == 6 free
    assert table is not None and table[:3] == list(hit.blocks) and len(table) == 6
    assert kv.num_free_blocks == 0
    kv.check_invariants()


def test_allocate_refuses_a_stale_or_misplaced_prefix_hit():
    kv, _ = cached_pool()
    waiting = grouped(16, "g", 12)
    hit = kv.lookup_prefix(waiting)
    computed(kv, grouped(20, None), 20)  # 5 blocks: the last one evicts a cached block
    with pytest.raises(ValueError, match="stale"):
        kv.allocate(waiting, 16, hit)
    assert waiting.request_id not in kv.holders()
    fresh = kv.lookup_prefix(waiting)
    assert len(fresh.blocks) < len(hit.blocks)
    holder = grouped(16, "g", 12)
    assert kv.allocate(holder, 4) is not None
    with pytest.raises(ValueError, match="holds blocks"):
        kv.allocate(holder, 16, fresh)
    kv.check_invariants()
