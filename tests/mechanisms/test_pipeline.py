"""Pipeline parallelism at decode and the two-GPU comparison: latency not reduced, throughput below 2x, what fits."""

import pytest

from lablib.mechanisms.parallel import LLAMA_3_1_8B, LLAMA_3_1_70B, decode_step
from lablib.mechanisms.pipeline import compare_two_gpus, pipeline_step


def test_pipeline_does_not_reduce_latency():
    one = decode_step(LLAMA_3_1_8B, 1, 1024, 1)
    assert pipeline_step(LLAMA_3_1_8B, 1, 1024, 1).latency_s == one.latency_s
    pp = pipeline_step(LLAMA_3_1_8B, 1, 1024, 2)
    assert pp.send_s == 8192 / 450e9 + 5e-6
    assert pp.latency_s == pytest.approx(one.latency_s + pp.send_s, rel=1e-12) and pp.latency_s > one.latency_s
    assert pp.throughput_tok_s == 1 / (max(pp.stage_s) + pp.send_s)
    assert 1.5 < pp.throughput_tok_s / one.throughput_tok_s < 2  # the last stage also holds the LM head


def test_compare_two_gpus_8b_and_70b():
    rows = {r["plan"]: r for r in compare_two_gpus(LLAMA_3_1_8B, 1)}
    one = decode_step(LLAMA_3_1_8B, 1, 1024, 1)
    assert rows["2 replicas (TP=1 each)"]["throughput_tok_s"] == 2 * one.throughput_tok_s
    assert rows["TP=2"]["latency_s"] < one.latency_s < rows["PP=2"]["latency_s"]
    assert [r["sequences_in_flight"] for r in rows.values()] == [1, 2, 2]
    assert all("not a measurement" in r["label"] for r in rows.values())
    big = {r["plan"]: r for r in compare_two_gpus(LLAMA_3_1_70B, 1)}
    assert big["2 replicas (TP=1 each)"]["fits"] is False and big["2 replicas (TP=1 each)"]["throughput_tok_s"] is None
    assert big["TP=2"]["fits"] and big["PP=2"]["fits"]


def test_a_stage_count_that_does_not_divide_the_layers_is_refused():
    with pytest.raises(ValueError, match=r"^pipeline_step\.p=3: allowed 1, 2, 4, 8, 16, 32 \(divisors of layers=32\)"):
        pipeline_step(LLAMA_3_1_8B, 1, 1024, 3)
