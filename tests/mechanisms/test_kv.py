"""KV sizing arithmetic and contiguous-vs-paged fragmentation."""


import pytest

from lablib.mechanisms.kv import (
    DTYPE_BYTES,
    bytes_per_element,
    kv_bytes_per_token,
    kv_cache_bytes,
    simulate_fragmentation,
)


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
    with pytest.raises(ValueError, match=r"kv_bytes_per_token\.num_layers=0: allowed integers >= 1"):
        kv_bytes_per_token(0, 8, 128, 2)
    with pytest.raises(ValueError, match=r"kv_cache_bytes\.batch=-1: allowed integers >= 0"):
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
def test_paged_waste_is_under_one_block_per_request(progress, chat_lengths):
    reqs = chat_lengths()
    r = simulate_fragmentation(reqs, 200_000, block_size=16, progress=progress)
    for reserved, used in zip(r.paged.reserved, r.paged.used):
        assert 0 <= reserved - used < 16
    assert r.paged.waste_fraction < 0.04


def test_contiguous_waste_dwarfs_paged_on_mixed_lengths(chat_lengths):
    reqs = chat_lengths()
    for reserve in ("max_model_len", "max_possible"):
        r = simulate_fragmentation(reqs, 200_000, block_size=16, max_model_len=2048, reserve=reserve)
        assert r.contiguous.waste_fraction > 0.6  # the vLLM paper's 60-80%
        assert r.contiguous.waste_fraction > 10 * r.paged.waste_fraction
        assert r.paged.max_concurrent > 2 * r.contiguous.max_concurrent


def test_fragmentation_validation():
    with pytest.raises(ValueError, match=r"simulate_fragmentation\.block_size=0: allowed integers >= 1"):
        simulate_fragmentation([(10, 5)], 1024, block_size=0)
    with pytest.raises(ValueError, match=r"workload\.requests\[1\]\.prompt_len=-3: allowed integers >= 1"):
        simulate_fragmentation([(10, 5), (-3, 5)], 1024)
    with pytest.raises(ValueError, match=r"workload\.requests\[0\]\.output_len=0: allowed integers >= 1"):
        simulate_fragmentation([(10, 0)], 1024)
    with pytest.raises(ValueError, match=r"budget_tokens=1000 cannot hold even one request.*2048"):
        simulate_fragmentation([(10, 5)], 1000, max_model_len=2048)
    with pytest.raises(ValueError, match=r"requests\[0\] needs 80 tokens but max_model_len=64"):
        simulate_fragmentation([(50, 30)], 1024, max_model_len=64)
    with pytest.raises(ValueError, match=r"simulate_fragmentation\.max_new_tokens=4: allowed integers >= 5"):
        simulate_fragmentation([(10, 5)], 4096, reserve="max_possible", max_new_tokens=4)
    with pytest.raises(ValueError, match=r"progress=1.5"):
        simulate_fragmentation([(10, 5)], 4096, progress=1.5)
    with pytest.raises(ValueError, match=r"reserve='all'"):
        simulate_fragmentation([(10, 5)], 4096, reserve="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"workload\.requests=\[\]: allowed at least one \(prompt_len, output_len\) pair"):
        simulate_fragmentation([], 4096)
