"""The tensor-parallel decode cost model: exact bytes, FLOPs and all-reduces, then what they predict."""

from dataclasses import replace

import pytest

from lablib.mechanisms.parallel import (
    H200,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    NVLINK4,
    PCIE_GEN4_X16,
    DenseShape,
    Gpu,
    Link,
    decode_step,
    kv_heads_per_gpu,
    memory_fit,
    params_per_gpu,
    ring_allreduce,
    smallest_fitting_tp,
    tp_sweep,
    valid_tp_sizes,
)
from lablib.models.architecture import architectures, parameter_count

# 2 layers, hidden 8, MLP 16, 4 heads of 2 dims, 2 KV heads, vocab 32, bf16: every number below is by hand.
TINY = DenseShape(layers=2, hidden=8, intermediate=16, heads=4, kv_heads=2, head_dim=2, vocab=32)
# Powers of two, so every time below is an exact binary fraction.
TOY_GPU = Gpu("toy", memory_bytes=10_000, hbm_bandwidth=1024, peak_flops=8192, overhead_s=0.5)
TOY_LINK = Link("toy", bandwidth=64, latency_s=0.25)


# --- bytes, FLOPs and all-reduces, by hand ------------------------------------------------------


def test_tiny_shape_params_per_gpu():
    # layer: q 8*4*2 + k,v 2*8*2*2 + o 4*2*8 = 192, MLP 3*8*16 = 384, norms 16; embedding + LM head 2*32*8; final norm 8
    assert params_per_gpu(TINY, 1) == 2 * (192 + 384 + 16) + 512 + 8 == 1704
    assert params_per_gpu(TINY, 2) == 2 * (96 + 192 + 16) + 256 + 8 == 872
    assert params_per_gpu(TINY, 4) == 2 * (64 + 96 + 16) + 128 + 8 == 488  # k,v stay 2*8*1*2: one KV head each


def test_tiny_shape_decode_step_t1_exact():
    s = decode_step(TINY, 3, 4, 1, TOY_GPU, TOY_LINK)
    assert s.weight_bytes == (1704 - 256) * 2 == 2896  # the input embedding is a lookup: its table is not streamed
    assert s.kv_bytes == 2 * 2 * 2 * 2 * 2 * 4 * 3 == 384  # 32 bytes/token x 4 tokens x 3 sequences
    assert s.flops == 2 * 1408 * 3 + 4 * 2 * 4 * 2 * 4 * 3 == 9216  # matmul params 2*(192+384) + LM head 256
    assert (s.allreduces, s.allreduce_bytes, s.allreduce_bandwidth_s, s.allreduce_latency_s) == (0, 0, 0.0, 0.0)
    assert (s.weights_s, s.kv_s, s.compute_s) == (2.828125, 0.375, 1.125)
    assert s.latency_s == 2.828125 + 0.375 + 0.5 == 3.703125
    assert s.throughput_tok_s == 3 / 3.703125 and s.dominant == "weights" and s.communication_share == 0.0


def test_tiny_shape_decode_step_t2_exact():
    s = decode_step(TINY, 3, 4, 2, TOY_GPU, TOY_LINK)
    assert (s.weight_bytes, s.kv_bytes, s.flops) == ((872 - 128) * 2, 192, 2 * 704 * 3 + 384)
    assert (s.allreduces, s.allreduce_bytes) == (4, 4 * 3 * 8 * 2)  # 2 per layer, batch x hidden x 2 bytes each
    assert s.allreduce_bandwidth_s == 4 * (48 / 64) == 3.0  # 2 (t-1)/t = 1 at t = 2
    assert s.allreduce_latency_s == 4 * 0.25 == 1.0
    assert s.latency_s == (1488 + 192) / 1024 + 3.0 + 1.0 + 0.5 == 6.140625
    assert s.communication_share == 4.0 / 6.140625 and s.dominant == "allreduce_bandwidth"
    assert s.throughput_per_gpu_tok_s == 3 / 6.140625 / 2


def test_overlap_hides_that_fraction_of_the_communication():
    assert decode_step(TINY, 3, 4, 2, TOY_GPU, TOY_LINK, overlap=0.5).latency_s == 1.640625 + 2.0 + 0.5
    full = decode_step(TINY, 3, 4, 2, TOY_GPU, TOY_LINK, overlap=1.0)
    assert full.latency_s == 1.640625 + 0.5 == 2.140625 and full.communication_share == 0.0
    assert full.allreduce_bandwidth_s == 3.0 and full.dominant == "weights"  # the parts are kept; the step hides them


def test_ring_allreduce_exact_and_zero_at_t1():
    assert ring_allreduce(4096, 1, TOY_LINK).total_s == 0.0
    got = {t: ring_allreduce(4096, t, Link("x", 1024, 0.25)) for t in (2, 4, 8)}
    assert {t: a.bandwidth_s for t, a in got.items()} == {2: 4.0, 4: 6.0, 8: 7.0}  # 2 (t-1)/t x 4096 / 1024
    assert {a.latency_s for a in got.values()} == {0.25}  # one per collective, whatever t
    assert got[8].total_s == 7.25


def test_kv_heads_replicate_when_fewer_than_t():
    assert [kv_heads_per_gpu(TINY, t) for t in (1, 2, 4)] == [2, 1, 1]
    assert decode_step(TINY, 3, 4, 4, TOY_GPU, TOY_LINK).kv_bytes == decode_step(TINY, 3, 4, 2, TOY_GPU, TOY_LINK).kv_bytes
    assert kv_heads_per_gpu(LLAMA_3_1_8B, 16) == 1
    assert memory_fit(LLAMA_3_1_8B, 1, 1024, 16).kv_bytes == memory_fit(LLAMA_3_1_8B, 1, 1024, 8).kv_bytes == 2**24


def test_tied_embeddings_hold_one_copy_and_read_the_same():
    tied = replace(TINY, tied_embeddings=True)
    assert params_per_gpu(tied, 1) == 1704 - 256
    assert decode_step(tied, 3, 4, 1, TOY_GPU, TOY_LINK).weight_bytes == 2896  # the LM head reads the shared table


# --- real shapes --------------------------------------------------------------------------------


def test_llama_8b_weights_and_the_project_formula_agree():
    cfg = architectures()["llama-3.1-8b"]
    assert DenseShape.from_config(cfg) == LLAMA_3_1_8B
    assert params_per_gpu(LLAMA_3_1_8B, 1) == parameter_count(cfg) == 8_030_261_248
    held = params_per_gpu(LLAMA_3_1_8B, 1) * 2
    assert held == 16_060_522_496 and abs(held / 16.06e9 - 1) < 0.01
    assert params_per_gpu(LLAMA_3_1_8B, 2) * 2 == 8_030_527_488  # half, plus the replicated norms


def test_llama_8b_batch1_on_h200_is_about_3_ms_plus_overhead():
    gpu = replace(H200, overhead_s=3e-4)
    s = decode_step(LLAMA_3_1_8B, 1, 1024, 1, gpu)
    read = 16_060_522_496 - 128256 * 4096 * 2  # the embedding table is not streamed at decode
    assert s.weight_bytes == read == 15_009_849_344 and s.kv_bytes == 131072 * 1024
    assert s.latency_s == pytest.approx((read + 2**27) / 4.8e12 + 3e-4, rel=1e-12)
    assert abs(s.latency_s / (16.06e9 / 4.8e12 + 3e-4) - 1) < 0.06  # 3.46 ms against the seeds' 3.65 ms
    assert s.dominant == "weights" and s.compute_s < s.weights_s / 100


def test_tp2_speeds_up_8b_at_batch1_more_over_nvlink_than_pcie():
    base = decode_step(LLAMA_3_1_8B, 1, 1024, 1).latency_s
    mem2 = (8_030_527_488 - 64128 * 4096 * 2 + 65536 * 1024) / 4.8e12
    nv, pcie = decode_step(LLAMA_3_1_8B, 1, 1024, 2, H200, NVLINK4), decode_step(LLAMA_3_1_8B, 1, 1024, 2, H200, PCIE_GEN4_X16)
    assert nv.latency_s == pytest.approx(mem2 + 64 * (8192 / 450e9 + 5e-6), rel=1e-12)
    assert pcie.latency_s == pytest.approx(mem2 + 64 * (8192 / 32e9 + 15e-6), rel=1e-12)
    assert nv.allreduce_latency_s > 10 * nv.allreduce_bandwidth_s  # at batch 1 latency, not bandwidth, is the cost
    rows = {r["link"]: r for r in (tp_sweep(LLAMA_3_1_8B, (1, 2), (1,), 1024, H200, link)[1] for link in (NVLINK4, PCIE_GEN4_X16))}
    assert rows["NVLink 4"]["speedup"] == pytest.approx(base / nv.latency_s, rel=1e-12)
    assert rows["NVLink 4"]["efficiency"] == pytest.approx(base / nv.latency_s / 2, rel=1e-12)
    assert 1 < rows["PCIe Gen4 x16"]["speedup"] < rows["NVLink 4"]["speedup"] < 2
    assert rows["NVLink 4"]["communication_share"] < rows["PCIe Gen4 x16"]["communication_share"]
    assert round(rows["NVLink 4"]["speedup"], 3) == 1.662 and round(rows["PCIe Gen4 x16"]["speedup"], 3) == 1.235


def test_pcie_at_large_batch_lets_communication_dominate():
    s = decode_step(LLAMA_3_1_8B, 256, 1024, 2, H200, PCIE_GEN4_X16)
    assert s.allreduce_bandwidth_s == pytest.approx(64 * 256 * 4096 * 2 / 32e9, rel=1e-12)
    assert s.dominant == "allreduce_bandwidth" and s.communication_share > 0.45
    assert decode_step(LLAMA_3_1_8B, 256, 1024, 2, H200, NVLINK4).communication_share < 0.15


def test_sweep_rows_cover_every_t_and_batch():
    rows = tp_sweep(LLAMA_3_1_8B)
    assert [(r["t"], r["batch"]) for r in rows] == [(t, b) for b in (1, 8, 64, 256) for t in (1, 2, 4, 8)]
    assert all(r["speedup"] == 1.0 and r["efficiency"] == 1.0 for r in rows if r["t"] == 1)
    b1 = [r for r in rows if r["batch"] == 1]
    assert [r["latency_s"] for r in b1] == sorted((r["latency_s"] for r in b1), reverse=True)
    assert [r["efficiency"] for r in b1] == sorted((r["efficiency"] for r in b1), reverse=True)  # falls with t


# --- memory fit ---------------------------------------------------------------------------------


def test_70b_bf16_does_not_fit_one_h200_but_fits_two():
    assert params_per_gpu(LLAMA_3_1_70B, 1) * 2 == 141_107_412_992  # over 141 GB before any KV
    assert not memory_fit(LLAMA_3_1_70B, 1, 1024, 1, H200, utilization=1.0).fits
    two = memory_fit(LLAMA_3_1_70B, 1, 1024, 2, H200)
    assert two.fits and two.need_bytes == two.weight_bytes + two.kv_bytes + two.reserve_bytes
    assert two.budget_bytes == 0.9 * 141e9
    assert smallest_fitting_tp(LLAMA_3_1_70B, 1, 1024, H200) == 2
    assert smallest_fitting_tp(LLAMA_3_1_70B, 64, 8192, H200) == 4  # 64 x 8k tokens of KV: 171.8 GB more
    assert smallest_fitting_tp(LLAMA_3_1_8B, 1, 1024, H200) == 1
    assert smallest_fitting_tp(LLAMA_3_1_70B, 1, 1024, H200, tps=(1,)) is None


# --- bad input ----------------------------------------------------------------------------------


def test_bad_inputs_are_refused_naming_the_field():
    assert valid_tp_sizes(LLAMA_3_1_8B) == [1, 2, 4, 8, 16, 32]
    gqa = DenseShape(layers=1, hidden=24, intermediate=24, heads=12, kv_heads=4, head_dim=2, vocab=10)
    assert valid_tp_sizes(gqa) == [1, 2, 4, 12]  # 3 and 6 divide the heads but split 4 KV heads unevenly
    with pytest.raises(ValueError, match=r"^params_per_gpu\.t=6: allowed 1, 2, 4, 12 \(.*kv_heads=4\)"):
        params_per_gpu(gqa, 6)
    with pytest.raises(ValueError, match=r"^decode_step\.t=0: allowed integers >= 1; Fix: "):
        decode_step(LLAMA_3_1_8B, 1, 1024, 0)
    with pytest.raises(ValueError, match=r"^decode_step\.t=3: allowed 1, 2, 4, 8, 16, 32 \(t must divide heads=32"):
        decode_step(LLAMA_3_1_8B, 1, 1024, 3)
    with pytest.raises(ValueError, match=r"^memory_fit\.t=12: allowed 1, 2, 4, 8, 16, 32 "):
        memory_fit(LLAMA_3_1_8B, 1, 1024, 12)
    with pytest.raises(ValueError, match=r"^decode_step\.batch=0: allowed integers >= 1; Fix: "):
        decode_step(LLAMA_3_1_8B, 0, 1024, 1)
    with pytest.raises(ValueError, match=r"^Link\.bandwidth=-1: allowed a number in \(0, inf\]; Fix: "):
        Link("bad", -1, 0.0)
    with pytest.raises(ValueError, match=r"^Gpu\.hbm_bandwidth=0: allowed a number in \(0, inf\]"):
        Gpu("bad", 1e9, 0, 1e12)
    with pytest.raises(ValueError, match=r"^decode_step\.overlap=1\.5: allowed a number in \[0, 1\]"):
        decode_step(LLAMA_3_1_8B, 1, 1024, 2, overlap=1.5)
    with pytest.raises(ValueError, match=r"^DenseShape\.kv_heads=3: allowed a divisor of heads=4"):
        replace(TINY, kv_heads=3)
