import pytest

from tokenfair.core.kv_cache import KVCacheManager

from .helpers import make_request


def test_allocate_grows_by_whole_blocks_and_free_returns_them():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    r = make_request()
    assert kv.allocate(r, 5)
    assert len(kv.block_tables[r.request_id]) == 2
    assert kv.allocate(r, 8)  # still fits in two blocks
    assert len(kv.block_tables[r.request_id]) == 2
    assert kv.allocate(r, 9)
    assert kv.num_free_blocks == 7
    kv.free(r)
    assert kv.num_free_blocks == 10
    kv.check_invariants()


def test_allocate_refuses_without_taking_anything():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a, b = make_request(), make_request()
    assert kv.allocate(a, 8)
    assert not kv.allocate(b, 8)
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
    assert kv.match_prefix(r) == 8
    assert len(kv.block_tables[r.request_id]) == 2
    kv.check_invariants()


def test_simulated_requests_without_tokens_hash_by_identity():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    r, other = make_request(input_tokens=9), make_request(input_tokens=9)
    kv.allocate(r, 9)
    r.num_computed_tokens = 9
    kv.cache_full_blocks(r)
    kv.free(r)
    assert kv.match_prefix(other) == 0  # someone else's blocks are not ours
    kv.free(other)
    assert kv.match_prefix(r) == 8


def test_at_least_one_token_is_left_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    r = make_request(input_tokens=8)
    r.prompt_token_ids = list(range(8))
    kv.allocate(r, 8)
    r.num_computed_tokens = 8
    kv.cache_full_blocks(r)
    kv.free(r)
    assert kv.match_prefix(r) == 4  # the last block is recomputed to produce a token


def test_shared_prefix_blocks_are_reference_counted():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a, b = make_request(input_tokens=9), make_request(input_tokens=9)
    a.prompt_token_ids = list(range(9))
    b.prompt_token_ids = list(range(9))
    kv.allocate(a, 9)
    a.num_computed_tokens = 9
    kv.cache_full_blocks(a)
    assert kv.match_prefix(b) == 8
    assert kv.block_tables[b.request_id] == kv.block_tables[a.request_id][:2]
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
    assert kv.match_prefix(old) == 0
    kv.free(old)
    assert kv.match_prefix(new) == 2
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
    assert kv.match_prefix(same) == 8
    other_group = grouped(30, "b/system", 12)
    assert kv.match_prefix(other_group) == 0
    no_group = grouped(30, None)
    assert kv.match_prefix(no_group) == 0


def test_a_whole_prompt_on_its_group_continues_it_with_the_output():
    # A chat turn: its prompt is the conversation so far; the next turn's prompt starts
    # with that prompt and its answer, so both are cache hits.
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    turn = grouped(8, "conv", 8)
    turn.output_token_ids = [1] * 8
    computed(kv, turn, 16)
    kv.free(turn)
    next_turn = grouped(20, "conv", 20)
    assert kv.match_prefix(next_turn) == 16


def test_prefix_lookups_take_nothing_and_report_what_admission_would_use():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    first = grouped(12, "g", 12)
    computed(kv, first, 12)
    kv.free(first)  # 3 cached blocks, all evictable
    waiting = grouped(16, "g", 12)
    assert kv.cached_prefix_blocks(waiting) == 3
    assert kv.num_free_blocks == 8 and waiting.request_id not in kv.block_tables
    # 3 idle cached blocks taken back + 1 new block for tokens 12..15.
    assert kv.blocks_to_admit(waiting, 16) == 4
    holder = grouped(13, "g", 12)
    assert kv.match_prefix(holder) == 12  # now held: taking them costs no free block
    assert kv.blocks_to_admit(waiting, 16) == 1


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
