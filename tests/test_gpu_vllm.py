"""Real vLLM on a real GPU (marker `gpu`): run on the GPU machine with `pytest -m gpu tests/test_gpu_vllm.py`.

Skipped, and reported as skipped, where there is no NVIDIA GPU or no vLLM: these assert what only real
hardware can show (KV capacity against the fit estimate, VRAM back to baseline, greedy tokens against HF, the lab's
load generator keeping up with vLLM's own server and agreeing with `vllm bench serve`).

GPU time (H200): ~10 min in all, more than one 10-minute GPU command, so the GPU session runs it in two
(`scripts/gpu_session.sh tests 590 -k "not 8b"`, then `-k 8b`): the first four tests (~80 s) and the client
at 256 streams (2 rounds of the lab's run and `vllm bench serve`'s, 190 s), then the 8B referee (its checkpoint,
a 100 s engine start, 8 rounds: 390 s).
"""
import importlib.util
import json
import os
from pathlib import Path

import pytest

from lablib import BenchConfig, HFConfig, HFEngine, VLLMConfig, VLLMEngine, load_workload, run
from lablib.hardware.device import device_facts
from lablib.results import token_agreement

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not device_facts().get("gpu") or importlib.util.find_spec("vllm") is None,
    reason="needs an NVIDIA GPU and vLLM (run on the GPU machine)")]


def keep(name: str, check: dict) -> None:
    """Write a cross-check's rounds (without the Results) where the GPU session packs them ($LABLIB_GPU_OUT), so a
    failing referee can be understood afterwards from its data, not only its message."""
    out = os.environ.get("LABLIB_GPU_OUT")
    if out:
        rounds = [{k: v for k, v in r.items() if k != "result"} for r in check.get("rounds", [])]
        Path(out, f"{name}.json").write_text(json.dumps({"rounds": rounds, "referee": check.get("referee"),
                                                         "server": check.get("server")}, default=str, indent=1))


@pytest.fixture(scope="module")
def vllm_run():
    wl = load_workload("journey", limit=16)
    with VLLMEngine("embedded", VLLMConfig(gpu_memory_utilization=0.3)) as eng:
        r = run(eng, wl, BenchConfig(max_new_tokens=32, progress=False), step="vllm")
    return eng, r


def test_kv_capacity_matches_the_fit_estimate(vllm_run):
    eng, _ = vllm_run
    assert 0.9 < eng.facts["kv_tokens"] / eng.facts["fit_estimate"]["kv_tokens"] < 1.1
    assert eng.facts["attention_backend"] != "unknown"


def test_vram_back_to_baseline_after_close(vllm_run):
    eng, _ = vllm_run
    assert eng.facts["vram_back_to_baseline"] is True


def test_records_and_roofline(vllm_run):
    _, r = vllm_run
    assert [q.output_tokens for q in r.requests] == [32] * 16
    assert all(len(q.token_times) == 32 and q.first_token <= q.last_token for q in r.requests)
    assert isinstance(r.roofline["mbu"], float) and 0 < r.roofline["mbu"] < 1


def test_greedy_tokens_agree_with_hf_in_the_same_dtype(vllm_run):
    _, r = vllm_run
    hf = HFEngine("embedded", HFConfig("static", 16, dtype="bfloat16"))
    h = run(hf, load_workload("journey", limit=16), BenchConfig(max_new_tokens=32, progress=False))
    hf.close()
    assert token_agreement(h, r) >= 0.5  # bf16 kernels differ; the H200 recording had 10 of 16 identical at 512 tokens


def test_lab_client_keeps_up_with_the_real_server(tmp_path):
    """The fastest token stream there is: the embedded model's server with 256 requests in flight (journey x16,
    1,024 requests, 123k tokens), the lab's client running as the lab runs it, its /metrics scraper on, then
    `vllm bench serve`, 2 rounds. Kept up: the lab's mean latency within 1.2x the API server's own, and its clumped
    reads at most 5 points above vLLM's client's on the same server in the same round.

    Seen on the H200: the lab's client read 25.3% of its gaps in clumps while its scraper parsed each ~600-line
    page (5-11 ms of Python under the client's GIL, every 0.5 s), and 0.0% with the scraper off (6 rounds; vLLM's
    client 0.0-0.4%); the scraper now parses only its gauges' lines (`prom.select`). What this point cannot do
    is referee throughput: in those 6 rounds the server's own steady rate moved 13.8k-27.0k tok/s under the lab's
    client and 15.5k-20.6k under vLLM's (spreads 24% and 10%), a tiny model's API server being the bottleneck
    (7-12% of each request's latency, and ~3 tokens per event at 256 streams: it merges a stream's tokens when
    behind). At lab 05's 32 in flight it was no steadier: 6 rounds, spreads 10.6% (lab) and 20.5% (vLLM), while
    vLLM's own inter-token histogram moved 2.5-3.5 ms between rounds: the engine's step itself, launch-bound on a
    tiny model, not either client. So the referee says "too noisy" on the embedded model at any load, and
    throughput agreement is tested where the server is steady: the synthetic 8B (next test)."""
    from lablib.experiments.serving.runs import cross_check

    check = cross_check("embedded", repeat=16, times=2, max_concurrency=256, out_dir=tmp_path, timeline=True)
    keep("keeps-up-embedded", check)
    for rnd, result in zip(check["rounds"], check["results"]):
        client = rnd["client"]
        assert result.config["metrics_during_test"] is True and result.engine_facts["server_metrics"]["samples"]
        assert client["server_http_ms"] is not None, client["verdict"]  # vLLM's HTTP histogram was read
        assert client["reference_clumped"] is not None, rnd["clumped"]  # vLLM's client's own reads
        assert client["kept_up"] is True, client["verdict"]


def test_lab_and_vllm_bench_serve_agree_on_the_8b(tmp_path):
    """On the synthetic 8B (bandwidth-bound steps): 8 rounds (L V, V L, ...) of the journey set x4 (256 requests,
    30.7k tokens) with 128 in flight, the same referee rule. Rounds from the spread seen on the H200: with lab
    2.6% and vLLM 0.5% round to round, 3 rounds gave a 99% bound of 13.4% (Welch df 2.1), 4 would give ~7%,
    6 ~4.2% and 8 ~3.3%: 8 resolve a 5% gap with room for a noisier round."""
    from lablib.experiments.serving.runs import cross_check
    from lablib.models.synthetic import synthetic_spec

    check = cross_check(synthetic_spec("llama-3.1-8b"), repeat=4, times=8, max_concurrency=128, out_dir=tmp_path,
                        gpu_memory_utilization=0.9, max_model_len=4096)
    keep("referee-8b", check)
    assert all(r["client"]["kept_up"] for r in check["rounds"]), [r["client"]["verdict"] for r in check["rounds"]]
    referee = check["referee"]
    assert referee["n"] == [8, 8] and referee["confidence"] == 0.99, referee
    assert referee["agree"], referee["verdict"]
