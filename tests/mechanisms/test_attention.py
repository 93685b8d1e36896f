"""The attention IO model: exact counts on hand-sized shapes, scaling laws, roofline, refusals."""

import pytest

from lablib.mechanisms.attention import (
    H200,
    AttentionShape,
    Gpu,
    attention_flops,
    block_sizes,
    loglog_slopes,
    naive_traffic,
    predict,
    query_key_pairs,
    roofline,
    tiled_traffic,
)

TINY = AttentionShape(4, 2)  # B=1, H=1, N=4, d=2, bf16
SRAM_2x2 = 32  # 16 bf16 elements: B_c = ceil(16 / 8) = 2, B_r = min(2, d=2) = 2


# --- hand counts: B=1, H=1, N=4, d=2 -----------------------------------------------------------


def test_naive_counts_by_hand():
    t = naive_traffic(TINY)
    # Q 8 + K 8 in, S 16 out, S 16 in, P 16 out, P 16 + V 8 in, O 8 out
    assert t.elements == 96 and t.stats_elements == 0 and t.bytes == 192
    assert t.extra_bytes == 2 * 16 * 2  # S and P, bf16
    assert naive_traffic(TINY, inplace_softmax=True).extra_bytes == 32
    assert t.flops_executed == 128


def test_block_sizes_follow_algorithm_1():
    assert block_sizes(SRAM_2x2, 2, 2) == (2, 2)
    assert block_sizes(16, 2, 2) == (1, 1)  # exactly one row each of Q, K, V, O
    assert block_sizes(H200.sram_bytes, 128, 2) == (128, 227)  # 116224 elements / 512
    assert block_sizes(H200.sram_bytes, 64, 2) == (64, 454)


def test_fa2_counts_by_hand():
    t = tiled_traffic(TINY, SRAM_2x2, order="fa2")
    # Q 8 in, O 8 out, K and V read once per query tile: 2 tiles x 2 x 8; logsumexp 4 fp32 out
    assert (t.elements, t.stats_elements, t.bytes) == (48, 4, 48 * 2 + 4 * 4)
    assert (t.block_r, t.block_c, t.tiles, t.extra_bytes) == (2, 2, 4, 16)


def test_fa1_counts_by_hand():
    t = tiled_traffic(TINY, SRAM_2x2, order="fa1")
    # O 8 initialised, K 8 + V 8 once, 4 tiles x (Q 4 in, O 4 in, O 4 out); l, m: 8 init + 4 tiles x 8
    assert (t.elements, t.stats_elements, t.bytes) == (72, 40, 72 * 2 + 40 * 4)
    assert t.extra_bytes == 2 * 4 * 4  # l and m, fp32


def test_causal_tiling_skips_blocks_above_the_diagonal():
    causal = AttentionShape(4, 2, causal=True)
    fa2 = tiled_traffic(causal, SRAM_2x2)
    assert fa2.tiles == 3  # (0,0), (1,0), (1,1); (0,1) skipped
    assert fa2.elements == 8 + 8 + 2 * 2 * (2 + 4)
    assert fa2.flops_executed == 4 * 2 * (2 * 2 + 2 * 4)  # diagonal tiles run whole
    fa1 = tiled_traffic(causal, SRAM_2x2, order="fa1")
    assert (fa1.elements, fa1.stats_elements) == (8 + 16 + 3 * 2 * 6, 8 + 4 * 6)
    assert naive_traffic(causal) == naive_traffic(TINY)  # naive computes then masks the full S


def test_fa2_with_block_rows_equal_to_d_reads_kv_n_over_d_times():
    shape = AttentionShape(1024, 64)
    t = tiled_traffic(shape, H200.sram_bytes)  # B_r = 64: T_r = 16
    assert t.elements == 2 * 1024 * 64 + 2 * 64 * 16 * 1024


# --- pairs and FLOPs ---------------------------------------------------------------------------


def test_causal_pairs_are_exact():
    assert query_key_pairs(4, 4, causal=False) == 16
    assert query_key_pairs(4, 4, causal=True) == 10  # N (N + 1) / 2, not N^2 / 2
    assert query_key_pairs(2, 5, causal=True) == 4 + 5  # bottom-right aligned
    assert query_key_pairs(1, 100, causal=True) == 100  # decode sees the whole context


def test_flops_exact():
    assert attention_flops(TINY) == 4 * 2 * 16
    assert attention_flops(AttentionShape(4, 2, causal=True)) == 4 * 2 * 10
    assert attention_flops(AttentionShape(8, 16, batch=2, heads=3)) == 4 * 2 * 3 * 64 * 16
    decode = AttentionShape(1, 128, heads=32, kv_heads=8, context_len=1000, causal=True)
    assert attention_flops(decode) == 4 * 32 * 1000 * 128


# --- scaling -----------------------------------------------------------------------------------


def _bytes(n: int, d: int = 64, m: int = H200.sram_bytes, order: str = "fa1") -> int:
    return tiled_traffic(AttentionShape(n, d), m, order=order).bytes


def test_naive_bytes_grow_as_n_squared():
    big, bigger = (naive_traffic(AttentionShape(n, 64)).bytes for n in (8192, 16384))
    assert bigger / big == pytest.approx(4, rel=0.01)


def test_fa1_bytes_scale_as_n2_d2_over_m():
    m = 64 * 1024
    assert _bytes(16384, m=m) / _bytes(8192, m=m) == pytest.approx(4, rel=0.01)
    assert _bytes(8192, d=128, m=m) / _bytes(8192, d=64, m=m) == pytest.approx(4, rel=0.05)
    assert _bytes(8192, m=m) / _bytes(8192, m=2 * m) == pytest.approx(2, rel=0.05)
    n, d, m_el = 8192, 64, m // 2
    elements = tiled_traffic(AttentionShape(n, d), m, order="fa1").elements
    assert elements == pytest.approx(12 * n * n * d * d / m_el, rel=0.02)  # Theorem 2's Theta, constant 12


def test_larger_sram_reduces_flash_bytes():
    fa1 = [_bytes(4096, m=m) for m in (2048, 8192, 32768, 131072)]
    assert fa1 == sorted(fa1, reverse=True) and len(set(fa1)) == 4
    fa2 = [_bytes(4096, m=m, order="fa2") for m in (2048, 8192, 32768, 131072)]
    assert fa2[0] > fa2[1] > fa2[2] == fa2[3]  # B_c 4, 16, then B_r capped at d = 64


# --- decode and GQA ----------------------------------------------------------------------------


def test_decode_reads_kv_once_and_is_memory_bound():
    decode = AttentionShape(1, 128, heads=32, kv_heads=8, context_len=4096)
    fa2 = tiled_traffic(decode, H200.sram_bytes)
    assert fa2.elements == 8 * (2 * 4 * 128 + 2 * 128 * 4096)  # 4 packed query heads, one tile
    naive = naive_traffic(decode)
    assert naive.elements == 2 * 32 * 128 + 2 * 8 * 4096 * 128 + 4 * 32 * 4096
    assert 1.0 < naive.bytes / fa2.bytes < 1.15  # no N x N to avoid: the win is small
    r = roofline(attention_flops(decode), fa2.bytes, H200.peak_flops, H200.hbm_bandwidth)
    assert r.bound == "memory" and r.intensity == pytest.approx(4, rel=0.01)  # g = 4 FLOP/byte


def test_gqa_reduces_kv_bytes():
    mha, gqa = AttentionShape(512, 64, heads=8), AttentionShape(512, 64, heads=8, kv_heads=2)
    assert naive_traffic(mha).elements - naive_traffic(gqa).elements == 2 * (8 - 2) * 512 * 64
    dec_mha = AttentionShape(1, 64, heads=8, context_len=4096)
    dec_gqa = AttentionShape(1, 64, heads=8, kv_heads=2, context_len=4096)
    assert tiled_traffic(dec_mha).bytes / tiled_traffic(dec_gqa).bytes == pytest.approx(4, rel=0.01)
    # prefill: packed tiles read K/V as often per query row, so only rounding changes
    assert tiled_traffic(mha).elements == tiled_traffic(gqa).elements


# --- roofline and the sweep --------------------------------------------------------------------


def test_roofline_picks_the_bound():
    r = roofline(2e12, 1e9, 1e15, 1e12)
    assert (r.bound, r.time_s, r.intensity) == ("compute", 2e-3, 2000.0)
    r = roofline(1e12, 2e9, 1e15, 1e12)
    assert (r.bound, r.time_s, r.compute_s, r.memory_s) == ("memory", 2e-3, 1e-3, 2e-3)
    ridge = H200.peak_flops / H200.hbm_bandwidth  # ~206 FLOP/byte
    assert roofline(210 * 1e9, 1e9, H200.peak_flops, H200.hbm_bandwidth).bound == "compute"
    assert roofline(ridge * 0.9 * 1e9, 1e9, H200.peak_flops, H200.hbm_bandwidth).bound == "memory"


def test_h200_spec_sheet_numbers():
    assert (H200.peak_flops, H200.hbm_bandwidth, H200.sms) == (989.5e12, 4.8e12, 132)
    assert (H200.sram_bytes, H200.smem_per_sm_bytes) == (227 * 1024, 228 * 1024)


def test_predict_rows_and_slopes():
    rows = predict([1024, 2048, 4096, 8192], 64, heads=4)
    assert [r.n for r in rows] == [1024, 2048, 4096, 8192] and {r.batch for r in rows} == {1}
    last = rows[-1]
    assert last.bytes_ratio == last.naive_bytes / last.flash_bytes
    assert last.naive_bound == "memory" and 3 < last.speedup < 4  # causal: naive runs the full S
    assert last.flash_extra_bytes == 4 * 8192 * 4 and last.naive_extra_bytes == 2 * 4 * 8192**2 * 2
    assert last.flops == attention_flops(AttentionShape(8192, 64, heads=4, causal=True))
    assert loglog_slopes([r.n for r in rows], [r.naive_bytes for r in rows])[-1] == pytest.approx(2, abs=0.02)
    long = predict([32768, 65536], 64, heads=4)  # causal tiles overshoot the diagonal by ~B_c / 2 keys
    assert 1.97 < loglog_slopes([r.n for r in long], [r.flash_bytes for r in long])[0] < 2.0
    fixed = predict([1024, 4096], 64, tokens=8192)
    assert [r.batch for r in fixed] == [8, 2]
    # batch x length constant: naive bytes = tokens x heads x (4 d + 4 N) x 2, linear in N at N >> d
    assert [r.naive_bytes for r in fixed] == [8192 * 16 * (4 * 64 + 4 * n) * 2 for n in (1024, 4096)]
    dec = predict([1024, 65536], 128, heads=32, kv_heads=8, decode=True)
    assert {r.flash_bound for r in dec} == {"memory"} and all(r.speedup < 1.15 for r in dec)


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda: AttentionShape(0, 64), r"^AttentionShape\.query_len=0: allowed integers >= 1; Fix: "),
    (lambda: AttentionShape(4, 0), r"^AttentionShape\.head_dim=0: allowed integers >= 1; Fix: "),
    (lambda: AttentionShape(4, -2), r"^AttentionShape\.head_dim=-2: allowed"),
    (lambda: AttentionShape(4, 2, element_bytes=0), r"^AttentionShape\.element_bytes=0: allowed integers >= 1"),
    (lambda: AttentionShape(4, 2, heads=8, kv_heads=3), r"^AttentionShape\.kv_heads=3: allowed a divisor of heads=8"),
    (lambda: AttentionShape(8, 2, context_len=4, causal=True), r"^AttentionShape\.query_len=8: allowed <= context_len=4"),
    (lambda: tiled_traffic(TINY, 15), r"^block_sizes\.sram_bytes=15: allowed integers >= 16; Fix: SRAM must hold"),
    (lambda: tiled_traffic(TINY, SRAM_2x2, order="fa3"), r"^tiled_traffic\.order='fa3': allowed 'fa1', 'fa2'"),
    (lambda: roofline(1e12, 1e9, 1e15, -1.0), r"^roofline\.bandwidth=-1\.0: allowed a number in \(0"),
    (lambda: roofline(1e12, 0, 1e15, 1e12), r"^roofline\.nbytes=0: allowed"),
    (lambda: Gpu("x", 1e15, -4.8e12, 1024, 1024, 1), r"^Gpu\.hbm_bandwidth=-4800000000000\.0: allowed"),
    (lambda: predict([1024, 0]), r"^predict\.seq_lens=\[1024, 0\]: allowed a non-empty list of integers >= 1"),
    (lambda: loglog_slopes([2, 1], [1, 2]), r"^loglog_slopes\.xs=\[2, 1\]: allowed strictly increasing"),
])
def test_bad_inputs_are_refused_naming_the_field(call, message):
    with pytest.raises(ValueError, match=message):
        call()
