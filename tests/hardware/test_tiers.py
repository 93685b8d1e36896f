"""The attendee's GPU: the shape and dtype each GPU the lab may meet takes, and how vLLM 0.26 runs FP8 and attention
there (read from its source), from NVML's own names, totals and capabilities (the rehearsal's fakes)."""
import pytest

from lablib.hardware import tiers


def facts(key: str, count: int = 1) -> dict:
    g = tiers.REHEARSAL_GPUS[key]
    return {"gpu": g["name"], "gpu_names": [g["name"]] * count, "gpu_count": count,
            "gpu_memory_bytes": [g["memory_mib"] * 2**20] * count,
            "cuda_compute_capability": "{}.{}".format(*g["capability"])}


@pytest.mark.parametrize("key, model, dtype, native_fp8", [
    ("T4", "llama-3.2-3b", "float16", False), ("L4", "llama-3.2-3b", "bfloat16", True),
    ("A10G", "llama-3.2-3b", "bfloat16", False), ("A100-40", "llama-3.1-8b", "bfloat16", False),
    ("A100-80", "llama-3.1-8b", "bfloat16", False), ("H100", "llama-3.1-8b", "bfloat16", True),
    ("H200", "llama-3.1-8b", "bfloat16", True)])
def test_each_gpu_takes_the_largest_shape_whose_weights_fit_half_its_memory(key, model, dtype, native_fp8):
    t = tiers.tier_of(facts(key))
    assert (t.model, t.dtype) == (f"synthetic:{model}", dtype)
    assert tiers.weight_bytes_16bit(model) <= tiers.WEIGHT_SHARE * t.memory_bytes
    bigger = tiers.SHAPES[:tiers.SHAPES.index(model)]
    assert all(tiers.weight_bytes_16bit(s) > tiers.WEIGHT_SHARE * t.memory_bytes for s in bigger)
    assert t.fp8_weights.startswith("W8A8" if native_fp8 else "W8A16")
    assert ("FlashAttention 3" in t.attention) == (t.capability[0] == 9)
    assert ("TRITON_ATTN" in t.attention) == (key == "T4")
    assert "tensor parallelism" in t.cannot and "2 or more GPUs" in t.cannot["tensor parallelism"]
    lines = t.lines()
    assert lines[0].startswith(f"1 x {t.gpu} (") and model in lines[0] and dtype in lines[0]


def test_two_gpus_can_run_tensor_parallelism_and_no_gpu_is_no_tier():
    assert "tensor parallelism" not in tiers.tier_of(facts("H200", count=2)).cannot
    assert tiers.tier_of({"gpu": None}) is None


def test_a_gpu_too_small_for_the_smallest_shape_says_so_and_takes_the_embedded_model():
    small = {**facts("T4"), "gpu_memory_bytes": [4 * 2**30]}
    t = tiers.tier_of(small)
    assert t.model == "embedded" and "real-size speed" in t.cannot and "llama-3.2-1b" in t.cannot["real-size speed"]
    assert tiers.shape_for(4 * 2**30) is None and tiers.shape_for(200 * 2**30) == tiers.SHAPES[0]


def test_the_tier_table_has_every_gpu_and_this_machine_first_when_it_has_one():
    rows = tiers.tier_table({"gpu": None})
    assert [r["gpu"] for r in rows] == list(tiers.REHEARSAL_GPUS)
    t4 = rows[0]
    assert (t4["model"], t4["dtype"], t4["attention"], t4["fp8_weights"]) == (
        "synthetic:llama-3.2-3b", "float16", "TRITON_ATTN", "W8A16")
    assert t4["weights_gb"] == round(tiers.weight_bytes_16bit("llama-3.2-3b") / 1e9, 1)
    here = tiers.tier_table(facts("H100", count=2))
    assert here[0]["gpu"] == "this machine: NVIDIA H100 80GB HBM3" and here[0]["cannot"] == "-"
    assert here[0]["attention"] == "FLASH_ATTN (FA3)" and len(here) == len(tiers.REHEARSAL_GPUS) + 1
