"""The memory budget check (lablib.hardware.fit), and its estimate against the KV capacity vLLM reported on the H200."""

import pytest

from lablib.config import VLLMConfig
from lablib.hardware.fit import ACTIVATION_OVERHEAD, CONTEXT_OVERHEAD, GRAPH_OVERHEAD, check_fit, weight_bytes
from lablib.models import ModelSpec, embedded_path, resolve_model
from lablib.results.reference import reference_facts
from lablib.models.architecture import architectures, parameter_count

GiB = 2**30
H200_TOTAL = 143771 * 2**20  # what NVML reports for an H200 (the recorded budget is 0.3 of it, see below)


def llama8b(**extra) -> ModelSpec:
    """Llama-3.1-8B by shape alone (no checkpoint on disk: weights are counted from the config)."""
    cfg = {**architectures()["llama-3.1-8b"], **extra}
    return ModelSpec("synthetic:llama-3.1-8b", "/nonexistent/llama-3.1-8b", "synthetic", cfg)


def test_the_budget_arithmetic():
    spec, total = llama8b(), 80 * GiB
    r = check_fit(spec, VLLMConfig(max_model_len=8192), total)
    assert r.budget_bytes == int(0.9 * total)
    assert r.weight_bytes == 2 * parameter_count(spec.config) == 2 * 8_030_261_248  # bf16, from the shape
    assert r.overhead_bytes == ACTIVATION_OVERHEAD + GRAPH_OVERHEAD == 1.5 * GiB
    assert r.kv_bytes == r.budget_bytes - r.weight_bytes - r.overhead_bytes - CONTEXT_OVERHEAD
    assert r.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024  # K and V, 32 layers, 8 KV heads of 128, bf16
    assert r.kv_tokens == r.kv_bytes // r.kv_bytes_per_token
    assert r.max_model_len == 8192 and r.max_concurrency == pytest.approx(r.kv_tokens / 8192)
    assert r.fits and r.advice == ""
    assert r.to_dict()["kv_tokens"] == r.kv_tokens
    eager = check_fit(spec, VLLMConfig(max_model_len=8192, enforce_eager=True), total)
    assert eager.overhead_bytes == 1 * GiB and eager.kv_tokens - r.kv_tokens == GiB // 2 // (128 * 1024)  # 4096


def test_weights_come_from_the_checkpoint_when_there_is_one():
    spec = resolve_model("embedded")
    assert weight_bytes(spec, VLLMConfig()) == (embedded_path() / "model.safetensors").stat().st_size
    assert check_fit(spec, VLLMConfig(), 16 * GiB).max_model_len == spec.config["max_position_embeddings"] == 2048


def test_fp8_kv_cache_halves_bytes_per_token_and_doubles_tokens():
    spec = llama8b()
    bf16 = check_fit(spec, VLLMConfig(max_model_len=8192), 80 * GiB)
    fp8 = check_fit(spec, VLLMConfig(max_model_len=8192, kv_cache_dtype="fp8"), 80 * GiB)
    assert fp8.kv_bytes == bf16.kv_bytes and fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.kv_tokens in (2 * bf16.kv_tokens, 2 * bf16.kv_tokens + 1)


def test_fp8_weights_and_tensor_parallel_shrink_the_weights():
    spec = llama8b(dtype="bfloat16")  # as a saved checkpoint's config says
    full = check_fit(spec, VLLMConfig(max_model_len=8192), 80 * GiB).weight_bytes
    tables = 2 * 128256 * 4096 * 2  # the untied embedding and LM head stay bf16 (vLLM's Fp8Config: Linears only)
    assert check_fit(spec, VLLMConfig(max_model_len=8192, quantization="fp8"), 80 * GiB).weight_bytes == \
        tables + (full - tables) // 2 == 9_080_934_400
    assert check_fit(spec, VLLMConfig(max_model_len=8192, tensor_parallel_size=2), 80 * GiB).weight_bytes == full // 2


def test_too_long_a_context_does_not_fit_and_says_which_knob():
    spec = llama8b()
    r = check_fit(spec, VLLMConfig(), 24 * GiB)  # max_model_len None: the model's own 131,072
    assert r.max_model_len == 131072 and 0 < r.kv_tokens < 131072 and not r.fits
    for knob in ("max_model_len=131,072", "lower max_model_len", "gpu_memory_utilization", "kv_cache_dtype='fp8'"):
        assert knob in r.advice
    assert f"{r.kv_tokens:,} KV tokens" in r.advice
    assert check_fit(spec, VLLMConfig(max_model_len=r.kv_tokens), 24 * GiB).fits  # exactly one sequence fits
    assert not check_fit(spec, VLLMConfig(max_model_len=r.kv_tokens + 1), 24 * GiB).fits
    small = check_fit(spec, VLLMConfig(max_model_len=8192), 16 * GiB)  # the weights alone overflow the budget
    assert small.kv_bytes == 0 and small.kv_tokens == 0 and not small.fits
    for knob in ("no max_model_len helps", "tensor_parallel_size", "quantization='fp8'"):  # the context is not the problem
        assert knob in small.advice, small.advice


def test_a_gpu_someone_else_uses_names_gpu_memory_utilization():
    spec, total = llama8b(), 80 * GiB
    r = check_fit(spec, VLLMConfig(max_model_len=8192), total, free_bytes=30 * GiB)
    assert not r.fits
    assert r.advice.startswith("gpu_memory_utilization=0.9 asks for 72.0 GiB but only 30.0 GiB is free")
    assert "lower gpu_memory_utilization" in r.advice
    # the CUDA context is not in the budget: asking for up to free + that allowance is fine
    edge = (30 * GiB + CONTEXT_OVERHEAD) / total
    assert check_fit(spec, VLLMConfig(max_model_len=8192, gpu_memory_utilization=edge), total, 30 * GiB).fits
    assert check_fit(spec, VLLMConfig(max_model_len=8192), total, free_bytes=79 * GiB).fits


def test_estimate_agrees_with_vllm_on_the_h200():
    """The cold-start run recorded vLLM's own KV capacity next to lablib's estimate: within 10%."""
    cold = reference_facts()["cold_start"]
    est = cold["fit_estimate"]
    assert est["budget_bytes"] == int(0.3 * H200_TOTAL)  # it ran at gpu_memory_utilization=0.3
    assert abs(est["kv_tokens"] - cold["kv_tokens"]) / cold["kv_tokens"] < 0.10
    assert est["kv_bytes_per_token"] == cold["kv_bytes_per_token"]
    # today's code on the same model and GPU still gives the estimate that was recorded
    now = check_fit(resolve_model("embedded"), VLLMConfig(gpu_memory_utilization=0.3), H200_TOTAL)
    assert now.to_dict() == pytest.approx(est)


def test_estimate_for_the_8b_model_agrees_with_vllm():
    big = reference_facts()["big_start"]  # synthetic Llama-3.1-8B, VLLMConfig(max_model_len=4096), gmu 0.9
    r = check_fit(llama8b(), VLLMConfig(max_model_len=4096), H200_TOTAL)
    assert abs(r.kv_tokens - big["kv_tokens"]) / big["kv_tokens"] < 0.10
    assert r.max_concurrency == pytest.approx(big["max_concurrency"], rel=0.10)


def test_vllm_kv_capacity_grows_by_one_token_per_kv_bytes_per_token():
    """Across the recorded gpu_memory_utilization sweep, each extra byte of budget became KV cache at
    lablib's bytes-per-token: the slope of vLLM's capacity checks the per-token arithmetic."""
    sweep = reference_facts()["sweep"]
    lo, hi = sweep[0], sweep[-1]
    extra_budget = (hi["gpu_memory_utilization"] - lo["gpu_memory_utilization"]) * H200_TOTAL
    bytes_per_token = extra_budget / (hi["kv_tokens"] - lo["kv_tokens"])
    assert bytes_per_token == pytest.approx(resolve_model("embedded").kv_bytes_per_token(), rel=0.02)


def test_tensor_parallel_splits_the_kv_heads_and_replicates_below_one_per_gpu():
    spec = llama8b()  # 8 KV heads
    per_tok = {t: check_fit(spec, VLLMConfig(max_model_len=8192, tensor_parallel_size=t), 80 * GiB).kv_bytes_per_token
               for t in (1, 2, 8, 16)}
    assert per_tok == {1: 128 * 1024, 2: 64 * 1024, 8: 16 * 1024, 16: 16 * 1024}  # t=16: one KV head each, replicated


def test_tp_fit_table_says_how_many_gpus_each_shape_needs():
    from lablib.hardware.fit import RESERVE_BYTES, tp_fit_table

    rows = {(r["model"], r["scheme"], r["gpu"]): r for r in tp_fit_table()}
    assert RESERVE_BYTES == CONTEXT_OVERHEAD + ACTIVATION_OVERHEAD + GRAPH_OVERHEAD  # check_fit's allowances
    big = rows[("llama-3.1-70b", "bf16", "H200")]
    assert 141.0 < big["weights_GB"] < 141.2 and big["tp1"] is False and big["smallest_tp"] == 2  # 141 GB > 0.9 x 141
    assert rows[("llama-3.1-70b", "fp8", "H200")]["smallest_tp"] == 1  # ~73 GB of weights: one H200
    assert rows[("llama-3.1-70b", "w4a16", "A100 80GB SXM")]["smallest_tp"] == 1
    assert rows[("llama-3.1-70b", "bf16", "A100 80GB SXM")]["smallest_tp"] == 4
    assert rows[("qwen2.5-72b", "bf16", "L4")]["smallest_tp"] == 8 and rows[("qwen2.5-72b", "bf16", "T4")]["smallest_tp"] is None
    assert all(rows[("llama-3.1-8b", s, "H200")]["smallest_tp"] == 1 for s in ("bf16", "fp8", "w4a16"))
    # embeddings and lm_head stay 16-bit: int4 weights are more than a quarter of bf16's
    assert rows[("llama-3.1-8b", "w4a16", "H200")]["weights_GB"] > rows[("llama-3.1-8b", "bf16", "H200")]["weights_GB"] / 4
    with pytest.raises(ValueError, match=r"tp_fit_table.schemes='int3': allowed"):
        tp_fit_table(schemes=("int3",))


def test_pipeline_parallel_splits_the_layers_weights_and_kv_with_tensor_parallel():
    spec = llama8b()  # 32 layers, 8 KV heads
    fit = {(t, p): check_fit(spec, VLLMConfig(max_model_len=8192, tensor_parallel_size=t, pipeline_parallel_size=p),
                             80 * GiB) for t, p in ((1, 1), (1, 2), (2, 2), (1, 3))}
    one = fit[1, 1]
    assert fit[1, 2].weight_bytes == one.weight_bytes // 2 and fit[2, 2].weight_bytes == one.weight_bytes // 4
    assert fit[1, 2].kv_bytes_per_token == 64 * 1024 and fit[2, 2].kv_bytes_per_token == 32 * 1024  # 16 layers each
    assert fit[1, 3].kv_bytes_per_token == 128 * 1024 * 11 // 32  # 32 layers in 3 stages: the first holds 11
    assert fit[1, 3].weight_bytes == one.weight_bytes * 11 // 32  # and the most weights: the GPU that binds
    assert VLLMConfig(tensor_parallel_size=2, pipeline_parallel_size=4).gpus == 8
    for field, bad in (("pipeline_parallel_size", 0), ("distributed_executor_backend", "slurm"),
                       ("disable_custom_all_reduce", "yes"), ("disable_custom_all_reduce", 1)):
        with pytest.raises(ValueError, match=f"VLLMConfig.{field}"):
            VLLMConfig(**{field: bad})
