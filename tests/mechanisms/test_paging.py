"""The block allocator and its step-by-step replay: block tables, the free list, preemption."""

import math

import pytest

from lablib.mechanisms.paging import BlockAllocator, OutOfBlocksError, replay_block_allocation


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
    with pytest.raises(ValueError, match=r"BlockAllocator\.block_size=0: allowed integers >= 1"):
        BlockAllocator(8, block_size=0)
    with pytest.raises(ValueError, match=r"BlockAllocator\.num_blocks=0: allowed integers >= 1"):
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
def test_replay_conserves_blocks_and_finishes_everything(num_blocks, chat_lengths):
    reqs = chat_lengths(30, seed=1)
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


def test_replay_respects_max_num_seqs_and_is_deterministic(chat_lengths):
    reqs = chat_lengths(20, seed=2)
    snaps = replay_block_allocation(reqs, 2000, max_num_seqs=3)
    assert max(len(s.block_tables) for s in snaps) == 3
    assert snaps == replay_block_allocation(reqs, 2000, max_num_seqs=3)


def test_replay_validation():
    with pytest.raises(ValueError, match=r"num_blocks=2 cannot hold even one request: requests\[0\] needs 3 blocks"):
        replay_block_allocation([(40, 1)], num_blocks=2, block_size=16)
    with pytest.raises(ValueError, match=r"replay_block_allocation\.max_num_seqs=0: allowed integers >= 1"):
        replay_block_allocation([(4, 1)], num_blocks=2, max_num_seqs=0)
    with pytest.raises(ValueError, match=r"workload\.requests\[0\]\.output_len=-1: allowed integers >= 1"):
        replay_block_allocation([(4, -1)], num_blocks=2)
