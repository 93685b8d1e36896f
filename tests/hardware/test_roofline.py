"""The peak table, device-name lookup and roofline arithmetic (pure Python, milliseconds)."""

import json

import pytest

from lablib.hardware.roofline import (
    GPU_PEAKS,
    GpuPeak,
    Roofline,
    achieved_bandwidth,
    decode_arithmetic_intensity,
    decode_bytes_per_step,
    decode_ceiling_tok_s,
    lookup_gpu,
    mbu,
    prefill_ceiling_tok_s,
)


@pytest.mark.parametrize(
    "device_name, key",
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("nvidia h200", "H200"),
        ("H100 SXM", "H100 SXM"),
    ],
)
def test_lookup_real_device_names(device_name, key):
    peak = lookup_gpu(device_name)
    assert peak is not None and peak.name == key
    assert peak is GPU_PEAKS[key]


@pytest.mark.parametrize(
    "device_name",
    ["NVIDIA H100", "NVIDIA A100", "NVIDIA GeForce RTX 4090 D", "NVIDIA L40", "NVIDIA B200",
     "AMD Instinct MI300X", "NVIDIA A100 80GB", "", None, "cpu"],
)
def test_lookup_unknown_or_ambiguous_is_none(device_name):
    assert lookup_gpu(device_name) is None


def test_every_table_key_looks_itself_up_and_missing_numbers_are_none():
    for key, peak in GPU_PEAKS.items():
        assert lookup_gpu(key) is peak
    assert GPU_PEAKS["T4"].bf16_flops is None and GPU_PEAKS["T4"].fp8_flops is None
    assert GPU_PEAKS["A100 80GB SXM"].fp8_flops is None
    assert GPU_PEAKS["H200"].fp8_flops == 2 * GPU_PEAKS["H200"].bf16_flops


def test_h200_ridge_point_about_206_flop_per_byte():
    assert GPU_PEAKS["H200"].ridge_point == pytest.approx(206, abs=1)
    assert GPU_PEAKS["A10G"].ridge_point is None
    assert decode_arithmetic_intensity(batch=1) == 1.0
    assert decode_arithmetic_intensity(batch=64) == 64.0


def test_gpu_peak_validation_names_the_field():
    with pytest.raises(ValueError, match="peak_bw"):
        GpuPeak("X", 0, None, None, None, 16)
    with pytest.raises(ValueError, match="fp8_flops"):
        GpuPeak("X", 1e9, None, None, -1.0, 16)


def test_8b_bf16_on_h200_batch1_ignoring_kv_is_about_299_tok_s():
    bw = lookup_gpu("NVIDIA H200").peak_bw
    assert bw == 4.8e12
    assert decode_ceiling_tok_s(bw, 16.06e9, 0, batch=1, context_len=0) == pytest.approx(298.9, abs=0.5)


def test_an_8b_decode_step_does_not_read_its_untied_input_embedding():
    from lablib.hardware.roofline import decode_weight_bytes
    from lablib.models.architecture import architectures, shape

    arch = shape(architectures()["llama-3.1-8b"])  # untied: 128256 x 4096 bf16 = 1,050,673,152 bytes
    read = decode_weight_bytes(16_060_522_496, arch)
    assert read == 16_060_522_496 - 1_050_673_152 == 15_009_849_344
    assert decode_ceiling_tok_s(4.8e12, read, 0, batch=1, context_len=0) == pytest.approx(319.8, abs=0.05)
    tied = shape(architectures()["llama-3.2-1b"])  # tied: its LM head reads the whole table every step
    assert tied["tie_word_embeddings"] is True and decode_weight_bytes(2_471_000_000, tied) == 2_471_000_000
    assert decode_weight_bytes(1e9, shape({})) == 1e9  # no shape known: nothing left out
    assert decode_weight_bytes(4096, arch) == 4096  # a stand-in file smaller than the table: nothing left out


def test_bytes_per_step_and_batching_with_kv():
    assert decode_bytes_per_step(1000, 10, 50) == 1500
    # batch 4 at context 100 with 10 B/token: 1000 + 4*100*10 = 5000 bytes per step, 4 tokens
    assert decode_ceiling_tok_s(5000.0, 1000, 10, batch=4, context_len=100) == pytest.approx(4.0)
    # batching helps while the KV cache is small next to the weights
    one = decode_ceiling_tok_s(4.8e12, 16e9, 131072, batch=1, context_len=1000)
    many = decode_ceiling_tok_s(4.8e12, 16e9, 131072, batch=32, context_len=1000)
    assert 20 < many / one < 32


def test_prefill_ceiling_is_flops_over_two_params():
    assert prefill_ceiling_tok_s(989.5e12, 8e9) == pytest.approx(989.5e12 / 16e9)


def test_achieved_bandwidth_and_mbu():
    # 100 tok/s at batch 1 reading 16e9 bytes per step = 1.6e12 B/s = 1/3 of an H200
    achieved = achieved_bandwidth(100.0, 1, 16e9, 0, 0)
    assert achieved == pytest.approx(1.6e12)
    assert mbu(achieved, 4.8e12) == pytest.approx(1 / 3)
    assert mbu(achieved, None) is None


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="batch"):
        decode_ceiling_tok_s(4.8e12, 16e9, 0, batch=0, context_len=0)
    with pytest.raises(ValueError, match="weight_bytes"):
        decode_bytes_per_step(-1, 0, 0)
    with pytest.raises(ValueError, match="peak_bw"):
        mbu(1.0, 0.0)
    with pytest.raises(ValueError, match="Roofline.batch"):
        Roofline("NVIDIA H200", 16e9, 0, 0, 0, 1.0)


def test_roofline_summary_known_gpu_is_json_able():
    d = Roofline("NVIDIA H200", 16.06e9, 0, batch=1, context_len=0, decode_tok_s=150.0).to_dict()
    json.dumps(d)
    assert d["gpu"] == "NVIDIA H200" and d["gpu_peak_entry"] == "H200"
    assert d["peak_bw"] == 4.8e12
    assert d["ceiling_tok_s"] == pytest.approx(298.9, abs=0.5)
    assert d["achieved_bw"] == pytest.approx(150 * 16.06e9)
    assert d["mbu"] == pytest.approx(150 / d["ceiling_tok_s"])


@pytest.mark.parametrize("gpu", [None, "NVIDIA B200"])
def test_roofline_summary_unknown_gpu_says_unknown(gpu):
    d = Roofline(gpu, 1e9, 1e5, batch=2, context_len=100, decode_tok_s=10.0).to_dict()
    json.dumps(d)
    assert d["peak_bw"] == d["ceiling_tok_s"] == d["mbu"] == "unknown"
    assert d["achieved_bw"] == pytest.approx(5 * (1e9 + 1e5 * 200))
