"""The vLLM engine on a CPU machine: the real worker process, driving a fake `vllm` (tests/fake_vllm).

The fake has exactly the API surface the worker uses (see its docstring), so these tests pin
lablib's side of the protocol: preflight refusals, nothing spawned before `start()` (and a
request too long for the context refused by `bench.offline.run` before it), the seeds recorded,
the spawned worker and what it reports,
records streamed as requests finish, a worker reused across calls, a start failure or a
hard crash turned into a RuntimeError without losing finished records, and close() leaving
no process and no VRAM behind. NVML is faked by patching pynvml: the "GPU memory used"
includes 8 GiB for every fake EngineCore alive, so the VRAM-settle check in close() is real.
"""

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import psutil
import pynvml
import pytest

from lablib.config import VLLMConfig
from lablib.engines import vllm as vllm_engine
from lablib.engines.base import PreparedRequest
from lablib.engines.vllm import VLLMEngine, preflight
from lablib.models import ModelSpec, check_model_dir, embedded_path, resolve_model
from lablib.models.synthetic import architectures
from tests.fake_vllm_support import BASE_USED, CORE_BYTES, GiB, alive, cores, fake_scores, wait_gone


def _live_children() -> set[int]:
    """Live descendants of this test process, minus multiprocessing's resource tracker (shared by all spawns)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _requests(lengths, prompt_lens=None):
    prompt_lens = prompt_lens or [3 + 2 * i for i in range(len(lengths))]
    return [PreparedRequest(f"r{i}", tuple(range(1, p + 1)), n) for i, (p, n) in enumerate(zip(prompt_lens, lengths))]


def _expected_ids(req):
    return [(len(req.prompt_ids) + i) % 100 for i in range(req.max_new_tokens)]


def _worker_and_core(engine, marker):
    [worker] = engine.worker_pids()
    found = [c.pid for c in psutil.Process(worker).children() if marker in c.cmdline()]
    assert len(found) == 1, "the fake LLM runs one EngineCore under the worker"
    return worker, found[0]


# ---------------------------------------------------------------- preflight: refused before any work starts


def test_preflight_without_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec answers None, as on this machine without the fake
    assert importlib.util.find_spec("vllm") is None
    with pytest.raises(ValueError, match=r"pip install 'lablib\[gpu\]'"):
        preflight(resolve_model("embedded"), VLLMConfig())


def test_preflight_without_a_gpu(with_fake_vllm, monkeypatch):
    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)  # what NVML does on a machine without the NVIDIA driver
    assert importlib.util.find_spec("vllm") is not None and "vllm" not in sys.modules
    with pytest.raises(ValueError, match="no NVIDIA GPU"):
        preflight(resolve_model("embedded"), VLLMConfig())


def test_preflight_on_a_turing_gpu_lets_vllm_pick_float16_and_refuses_bf16_asked_for(with_fake_vllm, fake_gpu):
    """vLLM 0.26 runs a bf16 checkpoint in float16 where bf16 is missing (dtype='auto': _resolve_auto_dtype falls
    back); only an explicit dtype='bfloat16' would fail there."""
    fake_gpu(name="Tesla T4", cc=(7, 5), total=15 * GiB)
    spec = resolve_model("embedded")  # a bfloat16 checkpoint
    assert preflight(spec, VLLMConfig())["fits"] is True
    with pytest.raises(ValueError, match=r"VLLMConfig\.dtype='bfloat16': allowed 'auto' or 'float16'.*Fix:") as e:
        preflight(spec, VLLMConfig(dtype="bfloat16"))
    assert "Tesla T4" in str(e.value) and "7.5" in str(e.value)
    assert preflight(spec, VLLMConfig(dtype="float16"))["fits"] is True  # the suggested fix passes


def test_preflight_fp8_where_vllm_runs_it(with_fake_vllm, fake_gpu):
    """FP8 weights from compute capability 7.5 (vLLM 0.26's Fp8Config minimum: FP8 Marlin, weights only, below 8.9);
    an FP8 KV cache from 8.0 (FlashInfer; FlashAttention 3 on 9.0), refused on a T4."""
    spec = resolve_model("embedded")
    fake_gpu(name="NVIDIA A100-SXM4-80GB", cc=(8, 0), total=80 * GiB)
    for config in (VLLMConfig(kv_cache_dtype="fp8"), VLLMConfig(quantization="fp8")):
        assert preflight(spec, config)["fits"] is True
    fake_gpu(name="Tesla T4", cc=(7, 5), total=15 * GiB)
    assert preflight(spec, VLLMConfig(quantization="fp8"))["fits"] is True
    with pytest.raises(ValueError, match=r"VLLMConfig\.kv_cache_dtype='fp8': allowed 'auto' on compute capability "
                                         r"7\.5.*Fix: kv_cache_dtype='auto'"):
        preflight(spec, VLLMConfig(kv_cache_dtype="fp8"))
    fake_gpu(name="NVIDIA H200", cc=(9, 0), total=140 * GiB)
    bf16, fp8 = preflight(spec, VLLMConfig()), preflight(spec, VLLMConfig(kv_cache_dtype="fp8"))
    assert fp8["kv_bytes_per_token"] * 2 == bf16["kv_bytes_per_token"] == spec.kv_bytes_per_token(2)


def test_preflight_refuses_a_config_that_cannot_fit(with_fake_vllm, fake_gpu):
    cfg = architectures()["llama-3.1-8b"]  # the shape alone: no checkpoint needs to exist
    spec = ModelSpec("synthetic:llama-3.1-8b", "/nonexistent/llama-3.1-8b", "synthetic", cfg)
    fake_gpu(name="Tesla T4", cc=(7, 5), total=16 * GiB)  # 16 GB of bf16 weights alone overflow 0.9 × 16 GiB
    with pytest.raises(ValueError, match=r"the weights alone .* so no max_model_len helps") as e:
        preflight(spec, VLLMConfig(max_model_len=131072))
    assert "tensor_parallel_size" in str(e.value) and "synthetic:llama-3.1-8b" in str(e.value)
    fake_gpu(name="NVIDIA L4", cc=(8, 9), total=24 * GiB)
    with pytest.raises(ValueError, match=r"max_model_len=131,072"):  # weights fit; one 128k sequence's KV does not
        preflight(spec, VLLMConfig(max_model_len=131072))
    report = preflight(spec, VLLMConfig(max_model_len=8192))
    assert report["fits"] is True and report["kv_tokens"] >= 8192
    fake_gpu(name="NVIDIA H200", cc=(9, 0), total=140 * GiB, free=40 * GiB)  # someone else holds 100 GiB
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0\.9 asks for 126\.0 GiB but only 40\.0 GiB is free"):
        preflight(spec, VLLMConfig(max_model_len=8192))
    assert preflight(spec, VLLMConfig(max_model_len=8192, gpu_memory_utilization=0.25))["fits"] is True


def test_preflight_of_a_hub_preset_cannot_know_the_shape(with_fake_vllm, fake_gpu):
    assert preflight(resolve_model("qwen3-0.6b"), VLLMConfig())["fits"] is None


# ---------------------------------------------------------------- the worker: start, facts, generate


def test_nothing_starts_before_start_and_a_long_request_is_refused_first(start):
    """The constructor runs only the preflight and the tokenizer; `bench.offline.run` checks every request against
    facts["context"] (known before start: config.max_model_len) and refuses a long one before any worker exists."""
    from lablib.bench.offline import run
    from lablib.config import BenchConfig
    from lablib.workloads import Workload, load_workload

    before = _live_children()
    engine = start.new(VLLMConfig(max_model_len=64))
    assert engine.facts["context"] == 64 and engine.facts["started"] is False
    assert engine.worker_pids() == [] and engine._proc is None
    journey = load_workload("journey")
    long = [r for r in journey if r.prompt_tokens + 8 > 64]
    w = Workload("journey", journey.version, journey.description, (journey.requests[0], *long), journey.manifest)
    assert journey.requests[0].prompt_tokens + 8 <= 64 < long[0].prompt_tokens + 8  # the first fits, the next not
    with pytest.raises(ValueError) as e:
        run(engine, w, BenchConfig(max_new_tokens=8, progress=False))
    msg = str(e.value)
    assert f"request {long[0].id}" in msg and f"prompt {long[0].prompt_tokens} + max_new_tokens 8" in msg
    assert "context of 64" in msg and "Fix" in msg and "max_new_tokens" in msg.split("Fix")[1]
    assert engine._proc is None and engine.worker_pids() == []  # no worker was spawned ...
    assert cores(start.marker) == [] and _live_children() - before == set()  # ... and no EngineCore
    engine.close()  # closing an engine that never started is harmless
    assert engine.facts["started"] is False


def test_engine_seed_and_bench_seed_are_both_recorded(start):
    from lablib.bench.offline import run
    from lablib.config import BenchConfig
    from lablib.workloads import load_workload

    engine = start.new(VLLMConfig(seed=7))
    assert engine.config.llm_kwargs()["seed"] == 7  # what the worker hands LLM(...)
    r = run(engine, load_workload("journey").head(2), BenchConfig(seed=3, max_new_tokens=2, progress=False))
    assert r.config["seed"] == 7 and r.config["bench_seed"] == 3  # neither overwrites the other
    assert r.config["ignore_eos"] is True and engine.facts["ignore_eos"] is True  # from the engine's facts
    assert engine.facts["started"] is True and [q.output_tokens for q in r.requests] == [2, 2]



def test_engine_starts_in_a_worker_and_reports_facts(start):
    t0 = time.perf_counter()
    engine = start(VLLMConfig(max_num_seqs=3, enforce_eager=True), FAKE_VLLM_GPU_BLOCKS=1234)
    wall = time.perf_counter() - t0
    f = engine.facts
    assert "vllm" not in sys.modules, "the notebook's process imported vLLM: it would hold the GPU"
    assert f["kv_blocks"] == 1234 and f["block_size"] == 16 and f["kv_tokens"] == 1234 * 16
    assert f["max_model_len"] == f["context"] == 2048  # the embedded model's own context
    assert f["max_concurrency"] == pytest.approx(1234 * 16 / 2048)
    assert f["max_num_seqs"] == 3 and f["max_num_batched_tokens"] == 16384
    assert f["attention_backend"] == "FLASH_ATTN"  # printed by the EngineCore child into the worker's log
    assert f["cuda_graphs"] is False and f["dtype"] == "bfloat16" and f["kv_cache_dtype"] == "auto"
    assert f["vllm"] == "0.26.0+fake" and f["synthetic"] is False
    assert 0 < f["startup_s"] < f["startup_wall_s"] <= wall
    assert f["fit_estimate"]["fits"] is True and f["kv_bytes_per_token"] == 2 * 5 * 2 * 64 * 2
    assert f["weight_bytes"] == (embedded_path() / "model.safetensors").stat().st_size
    assert f["vram_baseline_bytes"] == BASE_USED  # measured before the worker started
    json.dumps(f)
    worker, core = _worker_and_core(engine, start.marker)
    assert worker != os.getpid() and vllm_engine.nvml_used()[0] == BASE_USED + CORE_BYTES


def test_generate_streams_records_as_they_finish(start, monkeypatch):
    engine = start(FAKE_VLLM_STEP_SLEEP=0.05)
    reqs = _requests([5, 1, 3, 2])
    seen, seen_at = [], []

    def on_record(rec):
        seen.append(rec.request_id)
        seen_at.append(time.perf_counter())

    records = engine.generate(reqs, on_record=on_record, progress=False)
    assert [r.request_id for r in records] == ["r0", "r1", "r2", "r3"]  # request order
    assert seen == ["r1", "r3", "r2", "r0"]  # finish order: shortest first
    assert seen_at[-1] - seen_at[0] >= 3 * 0.045  # streamed over 4 steps, not handed over at the end
    for req, rec in zip(reqs, records):
        assert rec.output_tokens == req.max_new_tokens and rec.prompt_tokens == len(req.prompt_ids)
        assert rec.output_ids == _expected_ids(req)  # every token once: DELTA outputs, none doubled or lost
        assert len(rec.token_times) == rec.output_tokens
        assert rec.token_times == sorted(rec.token_times)
        assert all(b - a >= 0.045 for a, b in zip(rec.token_times, rec.token_times[1:]))  # one stamp per step
        assert rec.first_token == rec.token_times[0] <= rec.last_token == rec.token_times[-1] <= rec.finished
        assert rec.arrival == 0.0 and 0 <= rec.start <= rec.first_token
    metrics = engine.facts["last_run"]["metrics"]
    assert metrics["vllm:generation_tokens"] == 11 and metrics["vllm:request_success"] == 4
    assert metrics["vllm:prompt_tokens"] == sum(len(r.prompt_ids) for r in reqs)
    assert "vllm:time_to_first_token_seconds" not in metrics  # a histogram has no single value
    assert engine.facts["last_run"]["wall_s"] >= 5 * 0.045


def test_a_sweep_reuses_one_worker(start):
    engine = start(VLLMConfig(max_num_seqs=1))
    worker, core = _worker_and_core(engine, start.marker)
    first = engine.generate(_requests([2, 2]), progress=False)
    second_reqs = _requests([3, 1, 2], prompt_lens=[7, 98, 150])
    second = engine.generate(second_reqs, progress=False)
    assert engine.worker_pids() == [worker] and alive(core)
    assert [r.output_ids for r in second] == [_expected_ids(r) for r in second_reqs]
    assert [r.output_tokens for r in first + second] == [2, 2, 3, 1, 2]
    # max_num_seqs=1: each request is scheduled after the previous one finished (vLLM's clock, the worker's origin)
    for prev, nxt in zip(second, second[1:]):
        assert prev.finished <= nxt.start <= nxt.first_token
    assert engine.generate([], progress=False) == []
    assert engine.facts["last_run"]["metrics"]["vllm:generation_tokens"] == 10  # the engine's lifetime counter
    assert "vllm" not in sys.modules


def test_synthetic_model_runs_without_a_tokenizer_in_the_worker(start, tmp_path):
    folder = tmp_path / "tiny"  # a checkpoint with no tokenizer, as make_synthetic writes
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(embedded_path() / name, folder / name)
    spec = ModelSpec("synthetic:tiny", str(folder), "synthetic", check_model_dir(folder))
    engine = start(model=spec)  # the fake refuses a tokenizer-less folder unless skip_tokenizer_init=True
    assert engine.facts["synthetic"] is True and engine.tokenizer is not None
    [rec] = engine.generate(_requests([4]), progress=False)
    assert rec.output_ids == _expected_ids(_requests([4])[0])


# ---------------------------------------------------------------- failures: the worker's words, nothing lost or left


def test_start_failure_carries_the_workers_message(start):
    before = _live_children()
    with pytest.raises(RuntimeError, match="vLLM worker failed: RuntimeError: CUDA out of memory \\(fake\\)"):
        start(FAKE_VLLM_FAIL_START="CUDA out of memory (fake)")
    assert wait_gone(list(_live_children() - before)) == []


def test_error_during_generate_closes_the_engine(start):
    engine = start(VLLMConfig(max_model_len=64))
    worker, core = _worker_and_core(engine, start.marker)
    with pytest.raises(RuntimeError, match=r"ValueError: The decoder prompt \(length 100\) is longer than .* 64"):
        engine.generate(_requests([2, 2], prompt_lens=[10, 100]), progress=False)
    assert not alive(worker) and wait_gone([core]) == []
    with pytest.raises(RuntimeError, match="make a new VLLMEngine"):
        engine.generate(_requests([1]), progress=False)


def test_hard_crash_keeps_finished_records_and_leaves_nothing(start):
    before = _live_children()
    engine = start(VLLMConfig(max_num_seqs=1), FAKE_VLLM_CRASH_AFTER=2)
    worker, core = _worker_and_core(engine, start.marker)
    got = []
    with pytest.raises(RuntimeError, match=r"died \(exit code 3\) without a message") as e:
        engine.generate(_requests([2, 3, 2, 2]), on_record=got.append, progress=False)
    assert "EngineCore hit a fatal error after 2 finished requests" in str(e.value)  # the log's tail
    assert [r.request_id for r in got] == ["r0", "r1"] and [r.output_tokens for r in got] == [2, 3]
    engine.close()  # closing again is harmless
    assert not alive(worker) and wait_gone([core]) == []
    assert wait_gone(list(_live_children() - before)) == []
    assert engine.facts["vram_back_to_baseline"] is True
    with pytest.raises(RuntimeError, match="make a new VLLMEngine"):
        engine.generate(_requests([1]), progress=False)


class _LateConn:
    """The parent's pipe end, but its first wait gives up just before the worker's last messages land."""

    def __init__(self, conn, proc):
        self._conn, self._proc, self._raced = conn, proc, False

    def poll(self, timeout=0.0):
        if timeout and not self._raced:
            self._raced = True
            self._proc.join(30)  # meanwhile the worker sends its records and dies
            return False
        return self._conn.poll(timeout)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_records_sent_just_before_a_crash_are_not_lost(start):
    engine = start(VLLMConfig(max_num_seqs=1), FAKE_VLLM_CRASH_AFTER=2)
    engine._conn = _LateConn(engine._conn, engine._proc)
    got = []
    with pytest.raises(RuntimeError, match=r"exit code 3"):
        engine.generate(_requests([1, 1, 1]), on_record=got.append, progress=False)
    assert [r.request_id for r in got] == ["r0", "r1"]


def test_interrupt_in_the_callback_ends_the_worker(start):
    engine = start(FAKE_VLLM_STEP_SLEEP=0.02)
    worker, core = _worker_and_core(engine, start.marker)

    def on_record(rec):
        raise KeyboardInterrupt  # Kernel → Interrupt while the notebook draws a record

    with pytest.raises(KeyboardInterrupt):
        engine.generate(_requests([1, 5, 5]), on_record=on_record, progress=False)
    assert not alive(worker) and wait_gone([core]) == []
    with pytest.raises(RuntimeError, match="make a new VLLMEngine"):  # not a half-read pipe next time
        engine.generate(_requests([1]), progress=False)


# ---------------------------------------------------------------- close: no process, no VRAM left behind


def test_close_ends_worker_and_engine_core(start):
    engine = start(FAKE_VLLM_ORPHAN_WATCH=0)  # the EngineCore ends only if someone ends it
    worker, core = _worker_and_core(engine, start.marker)
    engine.generate(_requests([2]), progress=False)
    assert vllm_engine.nvml_used()[0] == BASE_USED + CORE_BYTES
    engine.close()
    assert not alive(worker) and not alive(core)
    assert engine.facts["vram_back_to_baseline"] is True and engine.facts["vram_after_close_bytes"] == BASE_USED
    with pytest.raises(RuntimeError, match="this vLLM engine is closed. Fix: make a new VLLMEngine"):
        engine.generate(_requests([1]), progress=False)
    engine.close()


def test_force_close_kills_the_whole_tree(start):
    engine = start(FAKE_VLLM_ORPHAN_WATCH=0)
    worker, core = _worker_and_core(engine, start.marker)
    engine.close(force=True)  # what an interrupt or a failure does: no polite "close" message
    assert not alive(worker) and not alive(core)
    assert engine.facts["vram_back_to_baseline"] is True


def test_vram_that_does_not_come_back_is_reported(start, monkeypatch):
    engine = start()
    monkeypatch.setattr(vllm_engine, "SETTLE_S", 1.0)
    stuck = BASE_USED + 2 * GiB  # from now on NVML says 2 GiB more than the baseline stay in use
    monkeypatch.setattr(vllm_engine, "nvml_used", lambda index=0: (stuck, 10 * GiB, 140 * GiB))
    t0 = time.monotonic()
    engine.close()
    assert time.monotonic() - t0 >= 1.0  # it waited for the GPU to settle
    assert engine.facts["vram_back_to_baseline"] is False and engine.facts["vram_after_close_bytes"] == stuck
    monkeypatch.setattr(vllm_engine, "SETTLE_S", 0.0)  # the fixture's final close need not wait again


def test_scheduler_sweep_restarts_one_engine_per_config_and_returns_to_baseline(start):
    """lablib.experiments.sweeps on the fake: a row per configuration, the knobs recorded, VRAM back after each engine."""
    from lablib.experiments import scheduling, sweeps
    from lablib.config import BenchConfig

    closed = []
    rows, results = sweeps.config_sweep(
        [VLLMConfig(max_num_seqs=n) for n in (2, 8)], workload="journey", step=lambda c: f"seqs{c.max_num_seqs}",
        bench=BenchConfig(max_new_tokens=4, progress=False), on_row=closed.append)
    assert [r["max_num_seqs"] for r in rows] == [2, 8] and [r.step for r in results] == ["seqs2", "seqs8"]
    assert closed == rows  # each row announced as its engine closed
    assert all(r["back_to_baseline"] and r["vram_after_close_bytes"] == BASE_USED for r in rows)
    assert all(len(r.requests) == 64 and r.summary["output_tokens"] == 256 for r in results)
    with pytest.raises(ValueError, match=r"VLLMConfig.max_num_batched_tokens=4: allowed >= max_num_seqs=8.*Fix"):
        scheduling.scheduler_sweep([8], [4])  # refused before any engine starts


def test_prefix_cache_hits_per_request_and_per_run_and_the_reset(start):
    """Each record carries vLLM's num_cached_tokens; each run its own counter deltas; the reset empties the cache."""
    engine = start(VLLMConfig(max_num_seqs=1, enable_prefix_caching=True))
    shared = list(range(1, 41))  # 40 tokens: two full 16-token blocks and a partial one
    reqs = [PreparedRequest(f"r{i}", tuple(shared + [100 + i] * (i + 1)), 2) for i in range(3)]
    first = engine.generate(reqs, progress=False)
    assert [r.cached_tokens for r in first] == [0, 32, 32]  # the first computes the shared blocks, the others reuse
    delta = engine.facts["last_run"]["metrics_delta"]
    assert delta["vllm:prefix_cache_hits"] == 64 and delta["vllm:prefix_cache_queries"] == sum(41 + i for i in range(3))
    again = engine.generate(reqs[:1], progress=False)
    assert again[0].cached_tokens == 32 and engine.facts["last_run"]["metrics_delta"]["vllm:prefix_cache_hits"] == 32
    assert engine.reset_prefix_cache() is True
    cold = engine.generate(reqs[:1], progress=False)
    assert cold[0].cached_tokens == 0 and engine.facts["last_run"]["metrics_delta"]["vllm:prefix_cache_hits"] == 0
    off = start(VLLMConfig(max_num_seqs=1))  # the lab's default: off (its journey repeats prompts)
    assert [r.cached_tokens for r in off.generate(reqs, progress=False)] == [None] * 3


def test_prompt_logprobs_score_every_token_after_the_first_and_the_engine_goes_on(start):
    """What perplexity on the GPU is made of: per prompt, the model's log-probability of each of its tokens after
    the first (vLLM's prompt_logprobs[1:]); the engine then serves generate as before."""
    import math

    from lablib.experiments.quantization.measures import from_logprobs

    fake_logprob = fake_scores()

    engine = start()
    prompts = [[5, 9, 2, 7], [3, 3]]
    got = engine.prompt_logprobs(prompts)
    assert got == [[fake_logprob(a, b) for a, b in zip(p, p[1:])] for p in prompts]
    ppl = from_logprobs(got)
    assert ppl.tokens == 4 and ppl.texts == 2 and math.isclose(ppl.ppl, math.exp(-sum(map(sum, got)) / 4))
    [rec] = engine.generate(_requests([3]), progress=False)
    assert rec.output_ids == _expected_ids(_requests([3])[0])


def test_preflight_refuses_parallel_sizes_this_machine_or_the_model_cannot_take(with_fake_vllm, fake_gpu, monkeypatch):
    fake_gpu(count=2)
    spec = resolve_model("embedded")  # 4 heads, 5 layers
    assert preflight(spec, VLLMConfig(tensor_parallel_size=2))["fits"] is True
    with pytest.raises(ValueError, match=r"needs 4 GPUs; this machine has 2.*distributed_executor_backend='ray'"):
        preflight(spec, VLLMConfig(tensor_parallel_size=2, pipeline_parallel_size=2))
    fake_gpu(count=8)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=8 does not divide .*4 attention heads"):
        preflight(spec, VLLMConfig(tensor_parallel_size=8))
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=6 is more stages than .*5 layers"):
        preflight(spec, VLLMConfig(pipeline_parallel_size=6))
    # 4 heads, 2 KV heads: TP=4 replicates each KV head twice, which vLLM allows
    assert preflight(spec, VLLMConfig(tensor_parallel_size=4))["fits"] is True
    qwen7b = ModelSpec("synthetic:qwen2.5-7b", "/nonexistent/qwen2.5-7b", "synthetic", architectures()["qwen2.5-7b"])
    with pytest.raises(ValueError, match=r"tensor_parallel_size=7 neither divides .*4 KV heads.*one of \[1, 2, 4, 28\]"):
        preflight(qwen7b, VLLMConfig(tensor_parallel_size=7, max_model_len=4096))  # 28 heads split 7 ways; 4 KV do not
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # NVML sees 8; a worker would see 1
    with pytest.raises(ValueError, match=r"needs 2 GPUs; this machine has 1"):
        preflight(spec, VLLMConfig(tensor_parallel_size=2))
    if importlib.util.find_spec("ray") is None:  # a Ray cluster may have more GPUs than this node: Ray itself is checked
        with pytest.raises(ValueError, match=r"needs Ray, which is not installed"):
            preflight(spec, VLLMConfig(tensor_parallel_size=4, pipeline_parallel_size=4,
                                       distributed_executor_backend="ray"))


def test_the_worker_reads_the_attention_backend_both_ways_vllm_logs_it():
    """vLLM 0.26's own lines, from the H200's worker logs: a backend it picks, and one `attention_backend` forces
    (the forced wording broke the first backend sweep: every row said 'unknown')."""
    from lablib.engines.vllm_worker import attention_backends

    picked = ("(EngineCore pid=1) INFO 12-01 16:12:03 [cuda.py:351] Using FLASH_ATTN attention backend out of "
              "potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].")
    forced = "(EngineCore pid=1) INFO 12-01 16:14:40 [cuda.py:330] Using AttentionBackendEnum.FLASHINFER backend."
    assert attention_backends(picked) == ["FLASH_ATTN"]
    assert attention_backends(forced) == ["FLASHINFER"]
    assert attention_backends("Using cache directory: /root/.cache/vllm for vLLM's torch.compile") == []


def test_the_worker_keeps_the_per_position_vector_and_its_growth_over_a_run():
    """vLLM's one Vector metric, spec_decode_num_accepted_tokens_per_pos (`values`, one count per draft position),
    survives the worker's metrics reading beside the scalars, and a run's delta is taken position by position, so
    lab 08 gets vLLM's acceptance per position (`counters_from_delta`)."""
    from types import SimpleNamespace as NS

    from lablib.engines.vllm_worker import _metrics, _minus
    from lablib.experiments.speculative.vllm_runs import counters_from_delta

    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    reads = iter([[NS(name="vllm:spec_decode_num_drafts", value=10.0), NS(name=name, values=[8, 5, 3])],
                  [NS(name="vllm:spec_decode_num_drafts", value=30.0), NS(name=name, values=[24, 14, 9, 2]),
                   NS(name="vllm:time_to_first_token_seconds", count=3, sum=0.2, buckets=[])]])
    llm = NS(get_metrics=lambda: next(reads))
    before, after = _metrics(llm), _metrics(llm)
    assert before == {"vllm:spec_decode_num_drafts": 10.0, name: [8, 5, 3]}
    delta = {k: _minus(after[k], before[k]) for k in after if k in before}
    assert delta == {"vllm:spec_decode_num_drafts": 20.0, name: [16, 9, 6, 2]}
    counters = counters_from_delta({**delta, "vllm:spec_decode_num_draft_tokens": 80.0,
                                    "vllm:spec_decode_num_accepted_tokens": 33.0})
    assert counters.accepted_per_pos == (16, 9, 6, 2) and counters.num_drafts == 20
    two = NS(get_metrics=lambda: [NS(name=name, values=[1, 2, 3]), NS(name=name, values=[4])])  # two engines' Vectors
    assert _metrics(two) == {name: [5, 2, 3]}  # summed position by position, none dropped


def test_preflight_counts_the_gpus_of_one_node_when_the_engine_spans_several(with_fake_vllm, fake_gpu):
    fake_gpu(count=8)
    spec = resolve_model("embedded")  # 4 heads, 5 layers
    nodes = dict(distributed_executor_backend="mp", master_addr="10.0.0.1", node_rank=0)
    assert preflight(spec, VLLMConfig(tensor_parallel_size=4, nnodes=1, **{k: v for k, v in nodes.items()
                                                                         if k != "master_addr"}))["fits"] is True
    with pytest.raises(ValueError, match=r"needs 8 GPUs over nnodes=2 \(4 each\); this machine has 2"):
        fake_gpu(count=2)
        preflight(spec, VLLMConfig(tensor_parallel_size=4, pipeline_parallel_size=2, nnodes=2, **nodes))
    fake_gpu(count=4)  # 4 of 4 on this node: vLLM's multiprocess executor does the rest across the nodes
    assert preflight(spec, VLLMConfig(tensor_parallel_size=4, pipeline_parallel_size=2, nnodes=2, **nodes))["fits"]
    other = VLLMConfig(tensor_parallel_size=4, pipeline_parallel_size=2, nnodes=2, **{**nodes, "node_rank": 1})
    with pytest.raises(ValueError, match=r"VLLMConfig\.node_rank=1: allowed 0 in VLLMEngine .* Fix: on that machine "
                       r"start `vllm serve MODEL --headless --nnodes 2 --node-rank 1 --master-addr 10\.0\.0\.1"):
        VLLMEngine(spec, other)  # node 1 runs vLLM's workers only: no engine here to send requests to


def test_a_spare_worker_imports_beside_one_start_and_serves_the_next_engine(start, monkeypatch):
    """LABLIB_VLLM_SPARE=1: the first engine's start also makes the next worker; the second engine takes it (no new
    spawn), with the model runner its caller set (vLLM reads it when the engine starts), and decodes as a spawned
    worker does. Without the variable nothing is spared."""
    monkeypatch.setenv(vllm_engine.SPARE_ENV, "1")
    monkeypatch.setattr(vllm_engine.Spare, "current", None)
    first = start(VLLMConfig(max_num_seqs=2))
    spare = vllm_engine.Spare.current
    assert first.facts["worker"] == "spawned" and spare is not None and spare.import_s is not None  # imported
    first.close()
    with vllm_engine.runner_env(False):
        second = start(VLLMConfig(max_num_seqs=2))
    assert second.facts["worker"] == "spare" and second._proc.pid == spare.proc.pid
    assert "fake-vllm: VLLM_USE_V2_MODEL_RUNNER=0" in Path(second.log_path).read_text()  # set after the import
    assert vllm_engine.RUNNER_ENV not in os.environ
    got = [r.output_tokens for r in second.generate(_requests([3, 2]))]
    assert got == [3, 2] and 0 < second.facts["startup_s"] < second.facts["startup_wall_s"]
    third_spare = vllm_engine.Spare.current  # the second start made the next one: ended at exit if never taken
    second.close()
    assert third_spare is not None and third_spare.proc.pid != spare.proc.pid
    third_spare.end()
    assert not third_spare.proc.is_alive()
    monkeypatch.delenv(vllm_engine.SPARE_ENV)
    monkeypatch.setattr(vllm_engine.Spare, "current", None)
    plain = start(VLLMConfig(max_num_seqs=2))
    assert plain.facts["worker"] == "spawned" and vllm_engine.Spare.current is None
