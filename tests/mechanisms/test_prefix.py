"""The prefix cache: chained full-block hashes, the last-token rule, ref counts, LRU eviction, vLLM's counters."""

import hashlib
import random

import pytest

from lablib.mechanisms.prefix import (
    CacheFullError,
    PrefixCache,
    block_hash,
    chain_hashes,
    predict_hits,
    simulate,
)

SYSTEM = list(range(1000, 1100))  # a 100-token shared system prompt


def test_only_full_blocks_are_hashed_and_each_hash_chains_to_its_parent():
    assert block_hash("", [1, 2]) == hashlib.sha256(b"|(1, 2)").hexdigest()  # stable across runs, unlike hash()
    assert len(chain_hashes(list(range(20)), 16)) == 1  # the 4-token tail has no hash
    first, second = chain_hashes([7] * 32, 16)
    assert first != second  # same tokens, different position: different K/V
    assert second == block_hash(first, [7] * 16)


@pytest.mark.parametrize("n, cached", [(15, 0), (16, 0), (17, 16), (64, 48), (65, 64)])
def test_the_last_prompt_token_is_always_recomputed(n, cached):
    prompt = list(range(n))
    result = simulate([prompt, prompt], block_size=16)
    assert result.cached_tokens == (0, cached)  # at most n - 1 tokens, rounded down to full blocks
    assert (result.queries, result.hits) == (2 * n, cached)


def test_requests_sharing_a_system_prompt_reuse_its_full_blocks():
    a, b = SYSTEM + list(range(20)), SYSTEM + list(range(50, 70))
    result = simulate([a, b], block_size=16)
    assert result.cached_tokens == (0, 96)  # 6 full blocks; the 7th mixes 4 system tokens with the question
    assert result.queried_tokens == (120, 120)


def test_the_shared_part_must_come_first():
    question = list(range(500, 520))
    dates = [list(range(900, 905)), list(range(910, 915))]
    first = simulate([SYSTEM + d + question for d in dates], block_size=16)
    after = simulate([d + SYSTEM + question for d in dates], block_size=16)
    assert first.cached_tokens == (0, 96)
    assert after.cached_tokens == (0, 0)  # block 0 differs, so every later block's chained hash does too
    assert after.hits == 0 and after.queries == 250


def test_multi_turn_chat_hits_grow_turn_by_turn():
    rng = random.Random(1)
    prompt = list(range(2000, 2040)) + [rng.randrange(100) for _ in range(10)]  # system 40 + user 10
    turns = []
    for _ in range(3):
        out = [rng.randrange(100, 200) for _ in range(20)]
        turns.append((list(prompt), out))
        prompt = prompt + out + [rng.randrange(200, 300) for _ in range(15)]
    assert [len(p) for p, _ in turns] == [50, 85, 120]
    hashed = simulate(turns, block_size=16)
    assert hashed.cached_tokens == (0, 64, 96)  # turn 1 wrote K/V for 50 + 19 tokens: 4 full blocks
    unhashed = simulate([(p, len(o)) for p, o in turns], block_size=16)
    assert unhashed.cached_tokens == (0, 48, 80)  # only prompt blocks: 50 -> 3 full blocks, 85 -> 5
    assert predict_hits([p for p, _ in turns], 16) == [0, 48, 80]


def test_eviction_takes_the_least_recently_freed_block_first():
    a, b, c = list(range(9)), list(range(10, 19)), list(range(20, 29))  # 2 full blocks of 4 + 1 token each
    result = simulate([a, b, c, b, a], block_size=4, num_blocks=6)
    # each request's partial third block, freed with no hash, goes to the head of the queue (vLLM's free_blocks) and
    # is handed out before any cached block is evicted: C evicts only A1 (A0 was freed after it), so B hits both its
    # blocks and A its first; the second A then evicts C1
    assert result.cached_tokens == (0, 0, 0, 8, 4)
    assert result.evictions == 2
    after_c = result.snapshots[2]
    assert after_c.free_queue == (1, 0, 3, 2, 5, 4)  # C's partial block 1 first, then A0, B1, B0, C1, C0
    assert after_c.blocks("cached") == (0, 2, 3, 4, 5) and after_c.blocks("free") == (1,)
    assert after_c.blocks("in_use") == () and after_c.evictions == 1


def test_a_request_frees_its_tail_first_so_its_prefix_survives_longest():
    a = list(range(12))  # 3 full blocks of 4, all hashed
    result = simulate([a, [50, 51, 52, 53], a], block_size=4, num_blocks=3)
    assert result.snapshots[0].free_queue == (2, 1, 0)  # freed in reverse: the tail block is next out
    assert result.cached_tokens == (0, 0, 8)  # the 4-token request evicted only A's third block
    assert result.evictions == 2


def test_ref_counts_keep_blocks_in_use_from_eviction():
    cache = PrefixCache(num_blocks=4, block_size=4)
    x = list(range(9))
    assert cache.allocate(0, x) == 0
    assert cache.allocate(1, x) == 8
    assert cache.ref_counts == [2, 2, 1, 1] and cache.num_free_blocks == 0
    with pytest.raises(CacheFullError, match=r"request 2 needs 1 new block\(s\) of 4 tokens but only 0 of the 4 blocks"
                       r" are free or evictable.*Fix: give the cache more blocks .* or run fewer requests at once"):
        cache.allocate(2, [100, 101, 102, 103])
    assert cache.free(0) == 3
    snap = cache.snapshot()
    assert snap.ref_counts == (1, 1, 0, 1) and snap.blocks("in_use") == (0, 1, 3) and snap.free_queue == (2,)
    assert cache.allocate(2, [100, 101, 102, 103]) == 0  # takes block 2, the only one no request holds
    assert cache.block_tables()[2] == (2,)
    cache.free(1)
    cache.free(2)
    assert cache.snapshot().free_queue == (3, 1, 0, 2)
    assert cache.allocate(3, x) == 8 and cache.evictions == 0  # blocks 0 and 1 kept their hashes while held
    assert cache.block_tables() == {3: (0, 1, 3)} and cache.ref_counts == [1, 1, 0, 1]


def test_admission_waits_until_a_requests_whole_lifetime_fits():
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]  # each will hold 4 + 5 tokens: 3 blocks of 4, and the cache has 4
    result = simulate([(a, 6), (b, 6)], block_size=4, num_blocks=4, concurrency=2)
    assert [s.admitted for s in result.snapshots if s.admitted] == [(0,), (1,)]
    assert result.snapshots[5].finished == (0,) and result.snapshots[6].admitted == (1,)  # no preemption needed
    assert len(result.snapshots) == 12 and result.evictions == 0  # b took a's unhashed blocks 2, 1 (at the head)
    assert result.snapshots[-1].hashed == (True, False, True, False)  # a's prompt block and b's survive


def test_append_with_ids_hashes_the_blocks_a_count_leaves_unhashed():
    cache = PrefixCache(num_blocks=8, block_size=4)
    cache.allocate(0, [1, 2, 3, 4, 5, 6])
    assert cache.append(0, [7, 8]) == []  # fills block 1: hashed
    assert cache.append(0, 1) == [2]  # unknown id: block 2 and later stay unhashed
    cache.append(0, [10, 11, 12, 13])
    assert cache.snapshot().hashed == (True, True, False, False, False, False, False, False)
    cache.free(0)
    assert cache.allocate(1, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8


def test_counters_add_up_like_vllms():
    prompts = [SYSTEM + [1], SYSTEM + [2], list(range(40)), SYSTEM + [3] * 30]
    result = simulate(prompts, block_size=16)
    assert result.cached_tokens == (0, 96, 0, 96)
    assert result.queries == 101 + 101 + 40 + 130 == sum(result.queried_tokens)
    assert result.hits == 192 == sum(result.cached_tokens)
    assert result.hit_rate == 192 / 372
    cache = PrefixCache(64)
    for i, p in enumerate(prompts):
        cache.allocate(i, p)
        cache.free(i)
    assert (cache.queries, cache.hits) == (result.queries, result.hits)


def _random_workload(rng, n=60, vocab=50):
    systems = [[rng.randrange(vocab) for _ in range(rng.randint(0, 80))] for _ in range(4)]
    prompts = []
    for _ in range(n):
        if prompts and rng.random() < 0.2:
            prompts.append(list(rng.choice(prompts)))  # a repeat
        else:
            prompts.append(rng.choice(systems) + [rng.randrange(vocab) for _ in range(rng.randint(1, 40))])
    return [(p, rng.randint(1, 6)) for p in prompts]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_predict_hits_equals_simulate_with_ample_blocks(concurrency):
    workload = _random_workload(random.Random(0))
    predicted = predict_hits([p for p, _ in workload], block_size=8)
    result = simulate(workload, block_size=8, concurrency=concurrency)
    assert list(result.cached_tokens) == predicted and result.evictions == 0
    assert result.hits == sum(predicted) and result.queries == sum(len(p) for p, _ in workload)
    assert 0 < sum(c == 0 for c in predicted) < len(predicted)  # some requests hit, some miss


@pytest.mark.parametrize("concurrency", [1, 3])
def test_scarce_blocks_only_lose_hits_and_keep_the_books(concurrency):
    workload = _random_workload(random.Random(0))
    ample = predict_hits([p for p, _ in workload], block_size=8)
    result = simulate(workload, block_size=8, num_blocks=24, concurrency=concurrency)
    assert result.evictions > 0 and result.hits < sum(ample)
    assert all(c <= a for c, a in zip(result.cached_tokens, ample, strict=True))
    for snap in result.snapshots:
        held = [b for table in snap.block_tables.values() for b in table]
        assert list(snap.ref_counts) == [held.count(b) for b in range(24)]
        assert sorted(snap.free_queue) == [b for b in range(24) if snap.ref_counts[b] == 0]
        assert len(snap.block_tables) <= concurrency
    assert max(len(s.block_tables) for s in result.snapshots) == concurrency


def test_bad_inputs_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"PrefixCache\.block_size=0: allowed integers >= 1; Fix: use 16"):
        PrefixCache(8, block_size=0)
    with pytest.raises(ValueError, match=r"simulate\.block_size=0: allowed integers >= 1"):
        simulate([[1, 2]], block_size=0)
    with pytest.raises(ValueError, match=r"simulate\.requests=\[\]: allowed a non-empty list of requests"):
        simulate([])
    with pytest.raises(ValueError, match=r"simulate\.requests\[0\]\.token_ids=\[\]: allowed a non-empty list of token"):
        simulate([[]])
    with pytest.raises(ValueError, match=r"simulate\.requests\[1\]\.token_ids\[1\]=2\.5: allowed integers >= 0"):
        simulate([[1], [1, 2.5]])
    with pytest.raises(ValueError, match=r"PrefixCache\.allocate\.token_ids\[0\]=True: allowed integers >= 0"):
        PrefixCache(4).allocate(0, [True])
    with pytest.raises(ValueError, match=r"simulate\.requests\[0\]\.output=0: allowed integers >= 1"):
        simulate([([1, 2], 0)])
    with pytest.raises(ValueError, match=r"simulate\.num_blocks=2: allowed integers >= 3; Fix: raise num_blocks, "
                                         r"or shorten requests\[1\]"):
        simulate([[1], list(range(40))], num_blocks=2)
    with pytest.raises(ValueError, match=r"simulate\.concurrency=0: allowed integers >= 1"):
        simulate([[1]], concurrency=0)
    with pytest.raises(ValueError, match=r"predict_hits\.prompts\[0\]=\[\]: allowed a non-empty list"):
        predict_hits([[]])
    cache = PrefixCache(4)
    cache.allocate(0, [1])
    with pytest.raises(ValueError, match=r"PrefixCache\.allocate\.request_id=0: allowed an id not already running"):
        cache.allocate(0, [1])
    with pytest.raises(KeyError, match=r"request 5 holds no blocks"):
        cache.free(5)
