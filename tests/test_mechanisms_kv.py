"""KV sizing arithmetic, contiguous-vs-paged fragmentation, and the block allocator."""

import math
import random

import pytest

from lablib.mechanisms.kv import (
    DTYPE_BYTES,
    BlockAllocator,
    OutOfBlocksError,
    bytes_per_element,
    kv_bytes_per_token,
    kv_cache_bytes,
    replay_block_allocation,
    simulate_fragmentation,
)


def mixed_workload(n: int = 200, seed: int = 0) -> list[tuple[int, int]]:
    """Chat-like lengths: log-normal prompts and outputs, a few hundred tokens on average."""
    rng = random.Random(seed)
    draw = lambda: min(1000, max(1, int(rng.lognormvariate(5.0, 1.0))))  # noqa: E731
    return [(draw(), draw()) for _ in range(n)]


# --- sizing -----------------------------------------------------------------------------------


def test_llama31_8b_bf16_is_128_kib_per_token():
    assert kv_bytes_per_token(32, 8, 128, "bfloat16") == 131072
    assert kv_bytes_per_token(32, 8, 128, 2) == 131072


def test_kv_cache_bytes_scales_with_context_and_batch():
    assert kv_cache_bytes(32, 8, 128, "bfloat16", context_len=8192, batch=1) == 2**30
    assert kv_cache_bytes(32, 8, 128, "fp8", context_len=8192, batch=4) == 2 * 2**30
    assert kv_cache_bytes(32, 8, 128, "float32", context_len=0, batch=4) == 0


def test_dtype_table():
    assert DTYPE_BYTES == {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}
    assert bytes_per_element("int8") == 1


def test_sizing_validation():
    with pytest.raises(ValueError, match=r"dtype='bf16' is not a known KV cache dtype.*bfloat16"):
        kv_bytes_per_token(32, 8, 128, "bf16")
    with pytest.raises(ValueError, match=r"num_layers=0 is out of range.*>= 1"):
        kv_bytes_per_token(0, 8, 128, 2)
    with pytest.raises(ValueError, match=r"batch=-1 is out of range"):
        kv_cache_bytes(32, 8, 128, 2, context_len=10, batch=-1)


# --- fragmentation ----------------------------------------------------------------------------


def test_fragmentation_exact_small_case():
    r = simulate_fragmentation([(10, 5), (20, 13)], 128, block_size=16, max_model_len=64)
    assert r.contiguous.reserved == (64, 64) and r.contiguous.used == (15, 33)
    assert r.paged.reserved == (16, 48) and r.paged.used == (15, 33)
    assert r.contiguous.waste_fraction == pytest.approx(1 - 48 / 128)
    assert r.paged.waste_fraction == pytest.approx(1 - 48 / 64)
    assert r.contiguous.max_concurrent == 2  # 128 // 64
    assert r.paged.max_concurrent == 4  # 8 blocks, requests take 1 and 3 alternately
    assert [row["scheme"] for row in r.rows()] == ["contiguous", "paged"]


def test_max_possible_reservation_and_progress():
    r = simulate_fragmentation([(10, 5), (20, 13)], 128, max_model_len=64, reserve="max_possible")
    assert r.contiguous.reserved == (23, 33)  # prompt + longest output
    r = simulate_fragmentation([(10, 5), (20, 13)], 128, max_model_len=64, reserve="max_possible", max_new_tokens=40)
    assert r.contiguous.reserved == (50, 60)
    r = simulate_fragmentation([(10, 5), (20, 13)], 128, max_model_len=64, progress=0.5)
    assert r.paged.used == (12, 26)


@pytest.mark.parametrize("progress", [0.0, 0.5, 1.0])
def test_paged_waste_is_under_one_block_per_request(progress):
    reqs = mixed_workload()
    r = simulate_fragmentation(reqs, 200_000, block_size=16, progress=progress)
    for reserved, used in zip(r.paged.reserved, r.paged.used):
        assert 0 <= reserved - used < 16
    assert r.paged.waste_fraction < 0.04


def test_contiguous_waste_dwarfs_paged_on_mixed_lengths():
    reqs = mixed_workload()
    for reserve in ("max_model_len", "max_possible"):
        r = simulate_fragmentation(reqs, 200_000, block_size=16, max_model_len=2048, reserve=reserve)
        assert r.contiguous.waste_fraction > 0.6  # the vLLM paper's 60-80%
        assert r.contiguous.waste_fraction > 10 * r.paged.waste_fraction
        assert r.paged.max_concurrent > 2 * r.contiguous.max_concurrent


def test_fragmentation_validation():
    with pytest.raises(ValueError, match=r"block_size=0 is out of range.*>= 1"):
        simulate_fragmentation([(10, 5)], 1024, block_size=0)
    with pytest.raises(ValueError, match=r"requests\[1\]\.prompt_len=-3 is out of range"):
        simulate_fragmentation([(10, 5), (-3, 5)], 1024)
    with pytest.raises(ValueError, match=r"requests\[0\]\.output_len=0"):
        simulate_fragmentation([(10, 0)], 1024)
    with pytest.raises(ValueError, match=r"budget_tokens=1000 cannot hold even one request.*2048"):
        simulate_fragmentation([(10, 5)], 1000, max_model_len=2048)
    with pytest.raises(ValueError, match=r"requests\[0\] needs 80 tokens but max_model_len=64"):
        simulate_fragmentation([(50, 30)], 1024, max_model_len=64)
    with pytest.raises(ValueError, match=r"max_new_tokens=4 is out of range.*>= 5"):
        simulate_fragmentation([(10, 5)], 4096, reserve="max_possible", max_new_tokens=4)
    with pytest.raises(ValueError, match=r"progress=1.5"):
        simulate_fragmentation([(10, 5)], 4096, progress=1.5)
    with pytest.raises(ValueError, match=r"reserve='all'"):
        simulate_fragmentation([(10, 5)], 4096, reserve="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"requests is empty"):
        simulate_fragmentation([], 4096)


# --- block allocator --------------------------------------------------------------------------


def test_block_allocator_tables_grow_one_block_at_a_time():
    a = BlockAllocator(num_blocks=4, block_size=16)
    assert a.allocate(7, 17) == (0, 1)
    assert a.num_free_blocks == 2
    assert [a.append_token(7) for _ in range(15)] == [None] * 15  # fills block 1 to 32 tokens
    assert a.append_token(7) == 2  # token 33 opens a new block
    assert a.block_table(7) == (0, 1, 2) and a.tokens() == {7: 33}
    assert a.allocate(8, 16) == (3,)
    assert not a.can_append(8) and not a.can_allocate(1)
    with pytest.raises(OutOfBlocksError, match=r"request 8 needs 1 more block\(s\) but only 0 of 4 are free"):
        a.append_token(8)
    assert a.free(7) == 3
    assert a.num_free_blocks == 3 and a.block_tables() == {8: (3,)}


def test_block_allocator_errors():
    with pytest.raises(ValueError, match=r"block_size=0 is out of range"):
        BlockAllocator(8, block_size=0)
    with pytest.raises(ValueError, match=r"num_blocks=0 is out of range"):
        BlockAllocator(0)
    a = BlockAllocator(2, block_size=4)
    a.allocate(0, 4)
    with pytest.raises(ValueError, match=r"request 0 already holds blocks"):
        a.allocate(0, 4)
    with pytest.raises(OutOfBlocksError, match=r"request 1 needs 2 more block"):
        a.allocate(1, 5)
    with pytest.raises(KeyError, match=r"request 5 holds no blocks"):
        a.free(5)


def check_snapshot_invariants(snap, block_size):
    tables = snap.block_tables
    held = [b for table in tables.values() for b in table]
    assert len(held) + snap.free_blocks == snap.total_blocks  # conservation
    assert len(set(held)) == len(held)  # no physical block shared between live requests
    assert all(0 <= b < snap.total_blocks for b in held)
    assert snap.used_tokens == sum(snap.tokens.values())
    for rid, table in tables.items():
        assert len(table) == math.ceil(snap.tokens[rid] / block_size)
        assert len(table) * block_size - snap.tokens[rid] < block_size
    assert 0 <= snap.waste_tokens < block_size * max(1, len(tables))


@pytest.mark.parametrize("num_blocks", [64, 200, 2000])
def test_replay_conserves_blocks_and_finishes_everything(num_blocks):
    reqs = mixed_workload(30, seed=1)
    reqs = [(min(p, 400), min(o, 400)) for p, o in reqs]  # every request fits 64 blocks alone
    snaps = replay_block_allocation(reqs, num_blocks, block_size=16)
    for snap in snaps:
        check_snapshot_invariants(snap, 16)
    assert [s.step for s in snaps] == list(range(len(snaps)))
    finished = [rid for s in snaps for rid in s.finished]
    assert sorted(finished) == list(range(len(reqs)))
    assert snaps[-1].free_blocks == num_blocks and snaps[-1].block_tables == {}
    if num_blocks == 2000:  # everything fits: all admitted at step 0, none preempted
        assert snaps[0].admitted == tuple(range(len(reqs)))
        assert not any(s.preempted for s in snaps)
    if num_blocks == 64:
        assert any(s.preempted for s in snaps)


def test_replay_timeline_exact():
    snaps = replay_block_allocation([(3, 2), (4, 1)], num_blocks=4, block_size=4)
    assert snaps[0].block_tables == {0: (0,), 1: (1,)} and snaps[0].tokens == {0: 3, 1: 4}
    assert snaps[1].finished == (1,) and snaps[1].block_tables == {0: (0,)} and snaps[1].tokens == {0: 4}
    assert snaps[2].finished == (0,) and snaps[2].free_blocks == 4
    assert len(snaps) == 3


def test_replay_respects_max_num_seqs_and_is_deterministic():
    reqs = mixed_workload(20, seed=2)
    snaps = replay_block_allocation(reqs, 2000, max_num_seqs=3)
    assert max(len(s.block_tables) for s in snaps) == 3
    assert snaps == replay_block_allocation(reqs, 2000, max_num_seqs=3)


def test_replay_validation():
    with pytest.raises(ValueError, match=r"num_blocks=2 cannot hold even one request: requests\[0\] needs 3 blocks"):
        replay_block_allocation([(40, 1)], num_blocks=2, block_size=16)
    with pytest.raises(ValueError, match=r"max_num_seqs=0"):
        replay_block_allocation([(4, 1)], num_blocks=2, max_num_seqs=0)
    with pytest.raises(ValueError, match=r"output_len=-1"):
        replay_block_allocation([(4, -1)], num_blocks=2)
