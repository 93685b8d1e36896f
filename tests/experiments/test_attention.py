"""Lab 02's experiments (lablib.experiments.attention) on the CPU: the IO model's prediction and what it says,
the microbenchmark's CPU preset as the lab shows it, the Hugging Face prefill on the embedded model (eager and sdpa
agree on the next token), the vLLM backend sweep's bookkeeping on a stand-in engine, the live/recorded/not-recorded
switch, and the GPU session's `record` round-tripping through JSON into the recorded path.

Timings here are never asserted (a shared 2-core machine); what is asserted is exact: statuses, correctness
against the float64 reference, slopes the IO model computes, the fields a row carries.
"""
from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from lablib import VLLMConfig  # noqa: E402
from lablib.experiments.attention import backends, findings, record, study
from lablib.mechanisms.attention import H200, predict  # noqa: E402
from lablib.results.reference import NotRecorded  # noqa: E402
from lablib.session import Shown  # noqa: E402
from lablib.workloads import load_workload  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread")]
TINY_BENCH = dict(seq_lens=[64, 128], decode_lens=[256], repeats=1, warmup=0)
REFUSAL = r"^{}\.{}=.+: allowed .+; Fix: .+"


# --- 1. the prediction ------------------------------------------------------------------------------------------

def test_prediction_is_the_io_model_per_sequence_at_the_benchmark_shape():
    rows = findings.prediction([1024, 4096])
    assert [r["n"] for r in rows] == [1024, 4096] and {r["batch"] for r in rows} == {1}
    assert {(r["head_dim"], r["heads"], r["causal"], r["gpu"]) for r in rows} == {(128, 16, True, H200.name)}
    model = predict([1024, 4096], 128, heads=16, causal=True)
    assert [r["flash_bytes"] for r in rows] == [m.flash_bytes for m in model]
    assert [r["speedup"] for r in rows] == [m.speedup for m in model]


def test_what_the_io_model_says_about_slopes_and_speedup():
    s = findings.prediction_summary(findings.prediction())
    sl = s["slopes"]
    assert sl["naive_bytes"] == pytest.approx(2, abs=0.005)  # 4 N^2 elements of S and P dominate
    assert 1.95 < sl["flash_bytes"] < 2.0  # FA2 also reads K and V once per query tile: ~N^2, a smaller constant
    assert sl["naive_extra_bytes"] == pytest.approx(2, abs=1e-9) and sl["flash_extra_bytes"] == pytest.approx(1, abs=1e-9)
    assert sl["flops"] == pytest.approx(2, abs=1e-3)
    assert s["bytes_ratio_max"] == pytest.approx(3.97, abs=0.01)  # causal: naive computes all of S, flash half
    assert s["naive_bound"] == s["flash_bound"] == "memory"  # HBM only: at d = 128 FA2 sits at 128 < 206 FLOP/byte
    assert s["speedups"] == sorted(s["speedups"]) and 2 < s["speedups"][0] and s["speedups"][-1] < 4
    text = findings.describe_prediction(s)
    assert f"{sl['naive_bytes']:.3f}" in text and f"{s['speedups'][-1]:.2f}x" in text


@pytest.mark.parametrize("kwargs, field", [({"head_dim": 0}, "head_dim"), ({"head_dim": 96}, "head_dim"),
                                           ({"hidden": 0}, "hidden")])
def test_prediction_refuses_bad_shapes(kwargs, field):
    with pytest.raises(ValueError, match=REFUSAL.format("prediction", field)):
        findings.prediction(**kwargs)


# --- 2. the microbenchmark here, 3. the GPU sweep ---------------------------------------------------------------

@pytest.fixture(scope="module")
def here():
    return study.kernels_here(**TINY_BENCH)


def test_kernels_here_is_live_on_this_cpu_and_correct(here):
    assert here.live and here.label == study.CPU_LABEL
    prov = here.value["provenance"]
    assert prov["config"]["device"] == "cpu" and prov["config"]["quick"] is True
    ok = {r["kernel"] for r in findings.rows_of(here) if r["status"] == "ok"}
    assert ok == {"naive", "sdpa_math", "sdpa_flash", "flex"}
    assert all(r["within_tol"] for r in findings.rows_of(here) + findings.rows_of(here, "decode") if r["status"] == "ok")
    assert here.value["prediction"] is None and "fp32" in here.value["prediction_note"]
    text = findings.describe_here(here)
    assert text.startswith("4 kernels ran and matched the float64 reference") and "[live on this CPU]" in text
    assert "not here: sdpa_cudnn" in text and "torch's CPU SDPA implements only" in text and "vllm_fa3" in text


def test_tables_and_speedups(here):
    frame = findings.table(here, "decode", ["kernel", "N", "status", "achieved_gbps"])
    assert list(frame.columns) == ["kernel", "N", "status", "achieved_gbps", "provenance"]
    assert set(frame["provenance"]) == {study.CPU_LABEL} and set(frame["N"]) == {256}
    ups = findings.speedups(here)
    assert {u["kernel"] for u in ups} == {"sdpa_math", "sdpa_flash", "flex"} and all(u["predicted"] is None for u in ups)
    naive = {r["N"]: r["median_ms"] for r in findings.rows_of(here) if r["kernel"] == "naive"}
    u = next(u for u in ups if u["kernel"] == "sdpa_flash" and u["N"] == 128)
    flash = next(r for r in findings.rows_of(here) if r["kernel"] == "sdpa_flash" and r["N"] == 128)
    assert u["measured"] == naive[128] / flash["median_ms"]


def h200(value: dict) -> dict:
    """A CPU run's value relabelled as the H200 bf16 run it stands in for (for the recorded path and the model)."""
    value = json.loads(json.dumps({k: value[k] for k in ("rows", "provenance")}))
    value["provenance"].update(device="NVIDIA H200", date="2026-12-02T10:00:00+00:00")
    value["provenance"]["config"].update(dtype="bf16", device="cuda")
    return value


def test_with_prediction_for_an_h200_bf16_run(here):
    got = findings.with_prediction(h200(here.value))
    assert got["prediction_note"] is None and set(got["prediction"]) == {64}
    assert [p["n"] for p in got["prediction"][64]] == [64, 128]
    assert got["prediction"][64] == findings.prediction([64, 128], 64, hidden=256)
    ups = findings.speedups(Shown(got, False, "x"))
    assert all(u["predicted"] == next(p["speedup"] for p in got["prediction"][64] if p["n"] == u["N"]) for u in ups)


def test_the_gpu_sweep_says_it_is_not_recorded_yet(monkeypatch):
    monkeypatch.setattr(study, "recorded_facts", lambda key, step: (_ for _ in ()).throw(NotRecorded(key, step)))
    shown = study.kernel_sweep(force=False)
    assert shown.value is None and not shown.live and "--steps attention" in shown.label
    assert findings.rows_of(shown) == [] and list(findings.table(shown)["provenance"]) == [shown.label]
    assert study.hf_prefill_gpu(force=False).value is None


def test_the_gpu_sweep_recorded_keeps_its_own_date_and_gets_the_model(monkeypatch, here):
    facts = {"attention": h200(here.value)}
    monkeypatch.setattr(study, "recorded_facts", lambda key, step: facts[key])
    shown = study.kernel_sweep(force=False)
    assert not shown.live and shown.label == "recorded on NVIDIA H200, 2026-12-02"
    assert set(shown.value["prediction"]) == {64}
    with pytest.raises(NotRecorded, match=r"attention\.hf_prefill is not recorded yet"):
        study._recorded_part("hf_prefill")
    assert study.hf_prefill_gpu(force=False).value is None  # the label names the step that records it


def test_the_gpu_sweep_live_calls_the_quick_preset_on_cuda(monkeypatch, here):
    calls = []
    monkeypatch.setattr(study, "run_attention_bench", lambda **kw: calls.append(kw) or (here.value["rows"],
                                                                                   here.value["provenance"]))
    shown = study.kernel_sweep(force=True)
    assert calls == [{"quick": True, "device": "cuda"}] and shown.live and shown.value["rows"] == here.value["rows"]


# --- 4a. Hugging Face prefill -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf():
    return study.hf_prefill("embedded", prompt_lens=[32, 96], device="cpu", repeats=1, warmup=0)


def test_hf_prefill_eager_and_sdpa_agree_and_flex_is_skipped_on_the_cpu(hf):
    rows = hf["rows"]
    assert [(r["impl"], r["prompt_tokens"], r["status"]) for r in rows] == [
        ("eager", 32, "ok"), ("eager", 96, "ok"), ("sdpa", 32, "ok"), ("sdpa", 96, "ok"),
        ("flex_attention", 32, "skipped"), ("flex_attention", 96, "skipped")]
    assert all(tuple(r) == study.HF_FIELDS for r in rows)
    for r in rows[:4]:
        assert r["reference_impl"] == "eager" and r["same_next_token"] is True
        assert r["max_abs_logit_diff"] < 1e-3  # fp32: the same maths, reassociated
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["extra_mem_bytes"] is None
        assert r["prefill_tok_s"] == pytest.approx(r["prompt_tokens"] / (r["median_ms"] / 1e3))
    assert rows[0]["max_abs_logit_diff"] == 0.0 and rows[-1]["reason"] == study.FLEX_ON_CPU
    prov = hf["provenance"]
    assert prov["model"] == "embedded" and prov["synthetic"] is False and prov["config"]["dtype"] == "float32"
    assert prov["config"]["skipped"] == ["flex_attention"]
    json.dumps(hf)


@pytest.mark.parametrize("kwargs, field", [
    ({"impls": ["flash_attention_2"]}, "impls"), ({"prompt_lens": [4096]}, "prompt_lens"),
    ({"prompt_lens": [0]}, "prompt_lens"), ({"repeats": 0}, "repeats"), ({"warmup": -1}, "warmup"),
    ({"device": "tpu"}, "device")])
def test_hf_prefill_refuses_before_loading(kwargs, field, monkeypatch):
    monkeypatch.setattr(study, "load_hf_model", lambda *a: pytest.fail("the model loaded before the arguments were checked"))
    with pytest.raises(ValueError, match=REFUSAL.format("hf_prefill", field)):
        study.hf_prefill("embedded", **({"device": "cpu"} | kwargs))


def test_an_oom_or_a_failure_is_a_row_and_the_sweep_goes_on():
    class Net:
        def set_attn_implementation(self, impl):
            if impl == "sdpa":
                raise ValueError("sdpa is not supported here\nsecond line")

        def __call__(self, **kw):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    ids = torch.zeros(1, 8, dtype=torch.long)
    oom = study._hf_point(Net(), "eager", ids, False, 0, 1, {})
    assert oom["status"] == "oom" and oom["reason"].startswith("OutOfMemoryError: CUDA out of memory")
    failed = study._hf_point(Net(), "sdpa", ids, False, 0, 1, {})
    assert failed["status"] == "failed" and failed["reason"] == "ValueError: sdpa is not supported here"


def test_hf_prefill_here_is_the_embedded_model_live_on_this_cpu(monkeypatch):
    got = []
    monkeypatch.setattr(study, "hf_prefill", lambda *a, **kw: got.append((a, kw)) or {"rows": [], "provenance": {}})
    shown = study.hf_prefill_here()
    assert shown.live and shown.label == study.CPU_LABEL
    assert got == [(("embedded",), {"device": "cpu", "repeats": 3, "warmup": 0})]


# --- 4b. vLLM backends ------------------------------------------------------------------------------------------

def test_backend_llm_kwargs():
    kw = backends.backend_llm_kwargs("FLASHINFER", VLLMConfig(gpu_memory_utilization=0.3))
    assert kw["attention_backend"] == "FLASHINFER" and kw["gpu_memory_utilization"] == 0.3
    assert kw == VLLMConfig(gpu_memory_utilization=0.3).llm_kwargs() | {"attention_backend": "FLASHINFER"}
    with pytest.raises(ValueError, match=REFUSAL.format("backend_llm_kwargs", "backend")):
        backends.backend_llm_kwargs("FLASH_ATTN_3")


def test_the_backend_sweep_on_a_stand_in_engine(hf_naive_cpu):
    """HF naive generate stands in for vLLM: the sweep's bookkeeping, not vLLM, is under test."""
    from lablib.config import BenchConfig

    asked, closed = [], []

    class Engine:
        def __init__(self, backend):
            self.inner, self.backend = hf_naive_cpu, backend
            self.name, self.spec, self.tokenizer, self.config = "vllm", hf_naive_cpu.spec, hf_naive_cpu.tokenizer, \
                hf_naive_cpu.config
            self.facts = {**hf_naive_cpu.facts, "attention_backend": backend, "startup_s": 1.5}

        def start(self):
            return self

        def generate(self, *a, **kw):
            return self.inner.generate(*a, **kw)

        def worker_pids(self):
            return []

        def close(self):
            closed.append(self.backend)

    def start(backend, kwargs):
        asked.append(kwargs["attention_backend"])
        if backend == "FLASHINFER":
            raise RuntimeError("vLLM worker failed: Head size 60 is not supported by FlashInfer.\nTraceback ...")
        return Engine(backend)

    rows, results = backends.vllm_backend_sweep(start, ["FLASH_ATTN", "FLASHINFER"], workload=load_workload("journey", limit=2),
                                         bench=BenchConfig(warmup_requests=0, max_new_tokens=2, progress=False))
    assert asked == ["FLASH_ATTN", "FLASHINFER"] and closed == ["FLASH_ATTN"] and len(results) == 1
    ok, failed = rows
    assert ok["status"] == "ok" and ok["ran"] == "FLASH_ATTN" and ok["startup_s"] == 1.5 and ok["output_tok_s"] > 0
    assert results[0].step == "vllm-attn-flash_attn"
    assert failed == {**dict.fromkeys(ok, None), "backend": "FLASHINFER", "status": "failed",
                      "reason": "RuntimeError: vLLM worker failed: Head size 60 is not supported by FlashInfer."}


def test_the_backend_sweep_refuses_an_unknown_backend_before_any_engine():
    with pytest.raises(ValueError, match=REFUSAL.format("backend_llm_kwargs", "backend")):
        backends.vllm_backend_sweep(lambda b, kw: pytest.fail("an engine started"), ["FLASH_ATTN", "XFORMERS"])


def test_vllm_backends_are_wired_recorded_and_said_not_recorded_without_it(unrecorded):
    assert backends.wired() is True  # VLLMConfig.attention_backend reaches vllm.LLM through llm_kwargs
    assert VLLMConfig(attention_backend="FLASHINFER").llm_kwargs()["attention_backend"] == "FLASHINFER"
    assert "attention_backend" not in VLLMConfig().llm_kwargs()  # None: vLLM's own choice
    with pytest.raises(ValueError, match=r"VLLMConfig.attention_backend='FA4': allowed"):
        VLLMConfig(attention_backend="FA4")
    shown = study.vllm_backends(force=False)  # the H200's sweep: every backend ran as itself on the embedded model
    assert not shown.live and shown.label.startswith("recorded on NVIDIA H200")
    assert [(r["backend"], r["status"]) for r in shown.value] == [(b, "ok") for b in backends.VLLM_BACKENDS]
    assert all(r["ran"] == r["backend"] and r["output_tok_s"] > 0 for r in shown.value), shown.value
    unrecorded("attention")
    shown = study.vllm_backends(force=False)
    assert shown.value is None and "not recorded yet" in shown.label and not shown.live


# --- the GPU session's step -------------------------------------------------------------------------------------

def test_record_writes_facts_attention_and_round_trips(monkeypatch, tmp_path, here, hf):
    bench_calls = []
    monkeypatch.setattr(record, "run_attention_bench", lambda **kw: bench_calls.append(kw) or (here.value["rows"],
                                                                                          here.value["provenance"]))
    monkeypatch.setattr(record, "hf_prefill", lambda spec, **kw: hf | {"asked": (spec, kw)})
    monkeypatch.setattr(record, "synthetic_spec", lambda name: f"spec:{name}")
    backend_rows = [{"backend": "FLASH_ATTN", "status": "ok", "output_tok_s": 1.0}]
    monkeypatch.setattr(record, "vllm_sweep_live", lambda *a, **k: (backend_rows, []))  # vLLM itself runs on the GPU
    facts: dict = {}
    record.record(tmp_path, store=None, facts=facts)
    got = facts["attention"]
    assert bench_calls == [study.RECORD_BENCH] and got["rows"] == here.value["rows"]
    assert got["hf_prefill"]["asked"] == ("spec:llama-3.1-8b", {"prompt_lens": study.HF_RECORD_LENS, "device": "cuda"})
    assert got["vllm_backends"]["rows"] == backend_rows and (tmp_path / "attention-vllm.json").exists()
    assert json.loads((tmp_path / "attention-bench.json").read_text())["rows"] == json.loads(json.dumps(got["rows"]))
    assert (tmp_path / "attention-hf.json").exists()
    packed = json.loads(json.dumps(facts, default=str))  # as scripts/pack_reference.py keeps it
    packed["attention"]["provenance"] = h200(packed["attention"])["provenance"]
    monkeypatch.setattr(study, "recorded_facts", lambda key, step: packed[key])
    shown = study.kernel_sweep(force=False)
    assert shown.label == "recorded on NVIDIA H200, 2026-12-02" and shown.value["rows"] == packed["attention"]["rows"]
    hf_shown = study.hf_prefill_gpu(force=False)
    assert hf_shown.value["rows"] == packed["attention"]["hf_prefill"]["rows"] and not hf_shown.live
    with pytest.raises(ValueError, match=REFUSAL.format("record", "parts")):
        record.record(tmp_path, None, {}, parts=["bench", "all"])
    assert math.isfinite(sum(r["median_ms"] for r in shown.value["rows"] if r["status"] == "ok"))


def test_the_recorded_hf_prefill_shows_the_recording_and_says_what_stands_in(monkeypatch, capsys):
    """Issue 11.8 as issue 28 left it: the recording (HF_RECORD_LENS) is shown whole, and the cell's own call
    (HF_GPU_LENS on the synthetic 8B) is told which lengths are shown instead of the asked ones."""
    rows = [{"impl": i, "prompt_tokens": n, "status": "ok"} for i in ("eager", "sdpa") for n in study.HF_RECORD_LENS]
    prov = {"device": "NVIDIA H200", "date": "2026-12-02T10:00:00+00:00", "model": "synthetic:llama-3.1-8b",
            "config": {"prompt_lens": list(study.HF_RECORD_LENS)}}
    monkeypatch.setattr(study, "recorded_facts", lambda key, step: {"hf_prefill": {"rows": rows, "provenance": prov}})
    lab = study.hf_prefill_gpu(force=False)
    assert lab.stand_ins == {"prompt_lens": {"asked": list(study.HF_GPU_LENS), "shown": list(study.HF_RECORD_LENS)}}
    assert lab.value["rows"] == rows and "prompt_lens: asked [1024, 4096, 16384]" in capsys.readouterr().out
    wide = study.hf_prefill_gpu(force=False, prompt_lens=(1024, 65536))
    assert wide.stand_ins == {"prompt_lens": {"asked": [1024, 65536], "shown": list(study.HF_RECORD_LENS)}}
    assert wide.value["rows"] == rows and "prompt_lens: asked [1024, 65536]" in capsys.readouterr().out
    assert findings.table(wide, "hf").shape[0] == len(rows) and findings.table(wide, "hf")["provenance"][0] == wide.label
    monkeypatch.setattr(study, "recorded_facts", lambda key, step: (_ for _ in ()).throw(NotRecorded(key, step)))
    none = study.hf_prefill_gpu(force=False, prompt_lens=(512,))
    assert none.value is None and none.stand_ins == {} and "--steps attention" in none.label


def test_off_float32_the_rung_checks_its_tokens_again_in_float32(monkeypatch):
    """On a GPU the rung runs in bfloat16, where sdpa and eager round differently: the pair runs again in float32,
    and the line says both. Here the CPU runs the bfloat16 rung (the same engines with dtype="bfloat16")."""
    from lablib.config import HFConfig
    from lablib.engines.hf import HFEngine
    from lablib.experiments.attention import study as attention
    from lablib.experiments import journey

    def bf16_steps(sizes):
        return [journey.Step(f"hf-static-b2{tail}", lambda m, impl=impl: HFEngine(m, HFConfig(
                    "static", 2, attn_implementation=impl, dtype="bfloat16"))) for tail, impl in (("", "eager"),
                                                                                              ("-sdpa", "sdpa"))]

    monkeypatch.setattr(study, "hf_steps", bf16_steps)  # the name journey_rung calls
    v = study.journey_rung(requests=3, batch=2, max_new_tokens=8).value
    assert v["dtype"] == "bfloat16" and v["float32"] is not v["agreement"]
    assert v["float32"]["identical"] == v["float32"]["of"] == 3  # float32: the same tokens, as on the CPU's rung
    line = study.agreement_line(v)
    assert f"Greedy tokens in bfloat16: {v['agreement']['identical']} of 3 requests identical" in line
    assert "in float32 on the CPU, 3 of 3 identical" in line
    assert ("nearly tied" in line) == (v["agreement"]["identical"] < 3)
    split = {**v, "agreement": {**v["agreement"], "identical": 2, "diverged": [{"first_divergence": 5}]}}
    assert "part at token 5" in study.agreement_line(split) and "nearly tied" in study.agreement_line(split)


def test_the_journeys_attention_rung_runs_both_kernels_and_keeps_the_tokens():
    """Lab 02's rung against lab 01's largest batch: the same requests, eager then sdpa, whole generate runs."""
    from lablib.experiments.attention import backends, findings, study

    shown = study.journey_rung(requests=3, batch=2, max_new_tokens=4)
    v = shown.value
    assert shown.live and [r["attention"] for r in v["rows"]] == ["eager", "sdpa"]
    assert [r["rung"] for r in v["rows"]] == ["hf-static-b2", "hf-static-b2-sdpa"] and v["identical"] is True
    assert v["ratios"]["tok_s"] == v["rows"][1]["output_tok_s"] / v["rows"][0]["output_tok_s"]
    assert all(r.summary["output_tokens"] == 12 for r in v["results"])
    assert list(findings.table(shown, "rung")["rung"]) == ["hf-static-b2", "hf-static-b2-sdpa"]
    assert v["dtype"] == "float32" and v["float32"] is v["agreement"] and v["agreement"]["of"] == 3
    line = study.journey_rung_lines(shown)
    assert "hf-static-b2-sdpa made" in line and "Greedy tokens in float32: 3 of 3 requests identical." in line
    with pytest.raises(ValueError, match=r"journey_rung\.batch=1: allowed integers 2\.\.64; Fix:"):
        study.journey_rung(batch=1)


@pytest.mark.usefixtures("one_thread")
def test_sdpa_backends_run_each_kernel_twice_and_say_which_pays_per_new_shape():
    """On this CPU: eager, PyTorch's choice and two forced SDPA kernels, each twice on the same batch (the same greedy
    tokens as eager, float32); a CUDA-only kernel is reported as not available, not dropped."""
    from lablib.experiments.attention.sdpa_cost import first_pass_cost, sdpa_backends, sdpa_lines

    shown = sdpa_backends(batch=2, requests=2, max_new_tokens=4,
                          backends=["eager", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa"])
    rows = shown.value["rows"]
    ran = [(r["backend"], r["pass"]) for r in rows if r["status"] == "ok"]
    assert ran == [(b, n) for b in ("eager", "sdpa-math", "sdpa-flash", "sdpa") for n in (1, 2)]
    gone = [r for r in rows if r["backend"] == "sdpa-efficient"]
    assert len(gone) == 1 and gone[0]["status"].startswith("not available: ")
    assert shown.value["identical"] == {"eager": True, "sdpa": True, "sdpa-math": True, "sdpa-flash": True}
    assert all(r["output_tok_s"] > 0 and r["ttft_p50_s"] > 0 for r in rows if r["status"] == "ok")
    assert "MATH" in shown.value["priority"] and set(first_pass_cost(rows)) == {"eager", "sdpa", "sdpa-math", "sdpa-flash"}
    line = sdpa_lines(shown)
    assert "sdpa-efficient: not available" in line and "PyTorch's SDPA order here: " in line


def test_first_pass_cost_reads_each_backends_two_passes():
    from lablib.experiments.attention.sdpa_cost import first_pass_cost, sdpa_lines
    from lablib.session import Shown

    rows = [{"backend": "sdpa", "pass": 1, "status": "ok", "wall_s": 3.0, "output_tok_s": 10.0},
            {"backend": "sdpa", "pass": 2, "status": "ok", "wall_s": 0.2, "output_tok_s": 150.0},
            {"backend": "eager", "pass": 1, "status": "ok", "wall_s": 0.21, "output_tok_s": 143.0},
            {"backend": "eager", "pass": 2, "status": "ok", "wall_s": 0.2, "output_tok_s": 150.0}]
    assert first_pass_cost(rows) == pytest.approx({"sdpa": 15.0, "eager": 1.05})
    value = {"rows": rows, "priority": ["CUDNN_ATTENTION", "FLASH_ATTENTION"], "cudnn_enabled": True, "batch": 8,
             "requests": 8, "max_new_tokens": 32}
    assert "Paid on first meeting a shape (over 2x): sdpa." in sdpa_lines(Shown(value, False, "recorded"))
