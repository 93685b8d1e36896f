"""Lab 10's tuning advisor: each setting against the recording or the model it says it rests on, recomputed here
from data/reference and lablib.mechanisms.parallel independently, and bad goals refused naming the field."""
from __future__ import annotations

import math

import pytest

from lablib.config import VLLMConfig
from lablib.experiments import advisor as adv
from lablib.experiments.advisor import Goal
from lablib.results.reference import load_reference


def _tok_s(step: str) -> float:
    return load_reference(step)[0].summary["output_tok_s"]


def _settings(goal: Goal) -> dict:
    return {r["knob"]: r["setting"] for r in adv.advise(goal)}


@pytest.mark.parametrize("field, value, words", [
    ("model", "gpt-5", "llama-3.1-8b"), ("gpu", "B200", "H200"), ("concurrency", 0, ">= 1"),
    ("shared_prefix_tokens", 600, "0 to 512"), ("tpot_slo_ms", 0, "milliseconds"),
    ("lowest_precision", "int2", "w4a16")])
def test_a_bad_goal_is_refused_naming_the_field_and_what_is_allowed(field, value, words):
    with pytest.raises(ValueError) as e:
        Goal(**{field: value})
    assert f"Goal.{field}={value!r}" in str(e.value) and words in str(e.value)


def test_the_quality_budget_and_the_gpu_decide_the_schemes_tried():
    assert adv.allowed_schemes(Goal(lowest_precision="bf16")) == ["bf16"]
    assert adv.allowed_schemes(Goal(lowest_precision="w4a16")) == ["bf16", "fp8", "w4a16"]
    assert adv.allowed_schemes(Goal(gpu="A100", lowest_precision="w4a16")) == ["bf16", "w4a16"]  # no FP8 on 8.0


def test_the_fit_is_lab_09s_one_long_sequence_of_the_70b():
    one = dict(model="llama-3.1-70b", concurrency=1, prompt_tokens=8000, output_tokens=192)
    assert adv.fit(Goal(**one), "bf16") == 2 and adv.fit(Goal(**one), "fp8") == 1  # lab 09's fit check
    assert adv.fit(Goal(**one, max_gpus=1), "bf16") is None


@pytest.mark.parametrize("concurrency, batch", [(1, 1), (6, 8), (64, 64), (200, 256)])
def test_the_weights_are_the_fastest_recorded_scheme_at_the_nearest_batch(concurrency, batch):
    goal = Goal(concurrency=concurrency, lowest_precision="w4a16", prompt_tokens=128, output_tokens=128)
    speeds = {s: _tok_s(f"{adv.RECORDED[s]}-b{batch}") for s in ("bf16", "fp8", "w4a16")}
    got = _settings(goal)["quantization"]
    assert got == "fp8" == max(speeds, key=speeds.get)  # the int4 seed claim, tested: FP8 is faster at every batch
    assert speeds["w4a16"] > speeds["bf16"] if batch <= 8 else True  # int4 beats bf16 only where bytes rule


def test_fewer_gpus_beat_a_faster_scheme_that_needs_more():
    rows = adv.advise(Goal(model="llama-3.1-70b", concurrency=8, lowest_precision="fp8"))
    got = {r["knob"]: r for r in rows}
    assert got["tensor_parallel_size"]["setting"] == 1 and got["quantization"]["setting"] == "fp8"
    assert "bf16: 2 GPUs; fp8: 1 GPU" == got["tensor_parallel_size"]["evidence"]


def test_a_tpot_slo_caps_the_batch_at_the_largest_that_meets_it_and_replicas_carry_the_rest():
    goal = Goal(concurrency=256, tpot_slo_ms=6.0, lowest_precision="bf16")
    got = _settings(goal)
    cap = got["max_num_seqs"]
    assert 1 <= cap < 256
    assert adv.predicted_tpot_ms(goal, "bf16", 1, cap) <= 6.0 < adv.predicted_tpot_ms(goal, "bf16", 1, cap + 1)
    assert got["replicas"] == math.ceil(256 / cap)


def test_an_slo_no_engine_meets_says_so_rather_than_inventing_a_batch():
    got = _settings(Goal(concurrency=16, tpot_slo_ms=0.5))
    assert got["max_num_seqs"] is None and got["replicas"] is None
    assert adv.engine_kwargs(Goal(concurrency=16, tpot_slo_ms=0.5))["max_num_seqs"] == 1


def test_fp8_kv_only_when_bf16_kv_does_not_fit():
    roomy = Goal(concurrency=64, lowest_precision="bf16", max_gpus=1)
    tight = Goal(concurrency=256, prompt_tokens=4096, output_tokens=256, lowest_precision="bf16", max_gpus=1)
    assert adv.fit(tight, "bf16") is None and adv.fit(tight, "bf16", "fp8") == 1
    assert _settings(roomy)["kv_cache_dtype"] == "auto" and _settings(tight)["kv_cache_dtype"] == "fp8"
    with pytest.raises(ValueError, match="Fix: lower concurrency"):  # not even FP8 KV holds it
        adv.advise(Goal(concurrency=1024, prompt_tokens=8192, lowest_precision="bf16", max_gpus=1))


def test_prefix_caching_says_what_the_shared_prefix_buys_from_lab_07s_pair():
    off, on = (load_reference(s)[0].summary for s in adv.PREFIX_PAIR)
    rows = {g: {r["knob"]: r for r in adv.advise(Goal(shared_prefix_tokens=g))} for g in (0, 200)}
    assert "nothing to reuse" in rows[0]["enable_prefix_caching"]["why"]
    assert "192 of each prompt's 512 tokens" in rows[200]["enable_prefix_caching"]["why"]
    assert f"x{on['output_tok_s'] / off['output_tok_s']:.2f}" in rows[200]["enable_prefix_caching"]["evidence"]


@pytest.mark.parametrize("concurrency, batch", [(1, 1), (5, 4), (20, 16), (300, 64)])
def test_speculation_is_advised_exactly_where_lab_08s_8b_pair_paid(concurrency, batch):
    ratio = _tok_s(f"spec-8b-draft_model-k4-b{batch}") / _tok_s(f"spec-8b-baseline-b{batch}")
    row = next(r for r in adv.advise(Goal(concurrency=concurrency)) if r["knob"] == "speculative_config")
    assert (row["setting"] is not None) == (ratio > 1) and f"x{ratio:.2f}" in row["evidence"]
    assert "recorded on NVIDIA H200" in row["source"]


def test_every_row_names_its_source_and_the_advice_is_a_config_the_engine_takes():
    for goal in (Goal(), Goal(model="llama-3.1-70b", gpu="A100", lowest_precision="w4a16", concurrency=32,
                              tpot_slo_ms=30), Goal(model="qwen2.5-72b", concurrency=128, lowest_precision="bf16")):
        rows = adv.advise(goal)
        assert all(r["source"] and r["why"] for r in rows), rows
        config = VLLMConfig(**adv.engine_kwargs(goal, rows))
        assert config.max_model_len == goal.context and config.tensor_parallel_size >= 1
