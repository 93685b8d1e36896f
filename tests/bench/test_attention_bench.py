"""The attention microbenchmark (lablib.bench.attention) on the CPU, and its quick preset on the GPU (marker `gpu`).

CPU: the kernels torch runs here (naive, SDPA MATH and FLASH, eager flex) agree with a float64 reference computed
by this file on the full N x N (N = 64..256, d = 64, causal and not, fp32 and bf16); the benchmark's own slice
check passes them and fails a wrong output; the quick CPU preset's rows carry every field and a status, the
kernels this machine lacks (SDPA EFFICIENT and CUDNN, vLLM's FA3) are 'unavailable' with torch's or the import's
reason; an OOM is marked and the sweep goes on; bad arguments are refused, naming the field, before any work.

GPU (`pytest -m gpu tests/bench/test_attention_bench.py`, ~1 min on an H200): the quick preset, every 'ok' row
within tolerance, every tiled kernel faster than naive at N >= 4096, naive at the top length out of memory or
holding S and P (>= 90% of the IO model's 2 B H N^2 elements). Noise: the medians of 10 calls are compared
where the IO model predicts naive >= 3x slower (mechanisms.attention.predict), so run-to-run spread (a few %)
cannot flip them.
"""
import importlib.util
import json
import math
import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from lablib.bench import attention as ab  # noqa: E402
from lablib.mechanisms.attention import H200, AttentionShape, attention_flops, naive_traffic  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread")]  # torch on one thread (conftest.py): a shared 2-core machine
SHAPE = re.compile(r"run_attention_bench\.(\w+)=.+: allowed .+; Fix: .+")


def exact(q, k, v, causal):
    """The full float64 reference: softmax(q k^T / sqrt(d), masked above the diagonal) v."""
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


def inputs(n, dtype=torch.float32, b=2, h=2, d=64, seed=0):
    return ab._inputs(b, h, n, n, d, dtype, "cpu", seed)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [64, 128, 256])
@pytest.mark.parametrize("name", ["naive", "sdpa_math", "sdpa_flash"])
def test_cpu_kernels_agree_with_the_fp32_reference(name, n, causal):
    q, k, v = inputs(n)
    out = ab.kernel(name)(q, k, v, causal)
    assert out.shape == (2, 2, n, 64) and out.dtype == torch.float32
    assert (out.double() - exact(q, k, v, causal)).abs().max() < 1e-5  # fp32 against float64: ~1e-7 seen
    err, ok = ab.check_output(out, q, k, v, causal, "fp32")
    assert ok and err < 1e-5


@pytest.mark.parametrize("causal", [True, False])
def test_eager_flex_agrees_on_the_cpu(causal):
    q, k, v = inputs(128)
    out = ab.kernel("flex", device="cpu")(q, k, v, causal)
    assert (out.double() - exact(q, k, v, causal)).abs().max() < 1e-5
    assert ab.check_output(out, q, k, v, causal, "fp32")[1]


@pytest.mark.parametrize("name", ["naive", "sdpa_math", "sdpa_flash"])
def test_bf16_on_the_cpu_is_within_the_bf16_tolerance(name):
    q, k, v = inputs(256, torch.bfloat16)
    out = ab.kernel(name)(q, k, v, True)
    ref = exact(q, k, v, True)
    scale = ref.abs() + ref.pow(2).mean(dim=-1, keepdim=True).sqrt()
    assert ((out.double() - ref).abs() <= ab.RTOL["bf16"] * scale).all()  # the rule, on every row, not the slice
    assert ab.check_output(out, q, k, v, True, "bf16")[1]


def test_the_check_fails_wrong_outputs_and_passes_one_rounding():
    q, k, v = inputs(256)
    good = exact(q, k, v, True).float()
    assert ab.check_output(good, q, k, v, True, "fp32")[1]
    assert ab.check_output(good.bfloat16().float(), q, k, v, True, "bf16")[1]  # one bf16 rounding of the truth
    assert not ab.check_output(torch.zeros_like(good), q, k, v, True, "bf16")[1]  # tiny outputs at long rows: still caught
    assert not ab.check_output(exact(q, k, v, False).float(), q, k, v, True, "bf16")[1]  # the mask forgotten
    assert ab.check_rows(1, 64) == [0] and ab.check_rows(256, 5) == [0, 64, 128, 191, 255]


@pytest.fixture(scope="module")
def quick_cpu():
    return ab.run_attention_bench(quick=True, device="cpu")


def test_quick_cpu_rows_carry_every_field_and_a_status(quick_cpu):
    rows, prov = quick_cpu
    assert rows and all(tuple(r) == ab.FIELDS for r in rows)
    assert {r["status"] for r in rows} <= {"ok", "oom", "unavailable", "wrong"}
    cfg = ab.QUICK_CPU
    prefill = [r for r in rows if r["panel"] == "prefill"]
    assert sorted({r["N"] for r in prefill}) == list(cfg["seq_lens"])
    for r in rows:
        assert r["heads"] == cfg["hidden"] // r["head_dim"] and r["dtype"] == "fp32"
        if r["panel"] == "prefill":
            assert r["batch"] == max(1, cfg["tokens"] // r["N"]) and r["causal"] is True
        if r["status"] == "ok":
            q_len = r["N"] if r["panel"] == "prefill" else 1
            shape = AttentionShape(q_len, r["head_dim"], r["batch"], r["heads"], context_len=r["N"],
                                   element_bytes=4, causal=r["causal"])
            assert r["tflops"] == pytest.approx(attention_flops(shape) / (r["median_ms"] / 1e3) / 1e12)
            assert r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["within_tol"] and r["max_abs_err"] < 1e-4
            assert r["extra_mem_bytes"] is None and r["pct_of_peak"] is None  # CPU: no CUDA allocator, no peak
    json.dumps({"rows": rows, "provenance": prov})  # plain data all the way down
    assert {"device", "hardware", "torch", "vllm", "versions", "date", "config", "peak_flops"} <= set(prov)
    assert prov["torch"] == torch.__version__ and prov["config"]["check"]["rtol"] == ab.RTOL["fp32"]


def test_quick_cpu_statuses_per_kernel(quick_cpu):
    rows, _ = quick_cpu
    by = {}
    for r in rows:
        by.setdefault(r["kernel"], set()).add(r["status"])
    assert by["naive"] == by["sdpa_math"] == by["sdpa_flash"] == by["flex"] == {"ok"}
    for r in rows:
        if r["kernel"] in ("sdpa_efficient", "sdpa_cudnn"):  # CUDA-only backends: torch's own refusal, and why
            assert r["status"] == "unavailable" and "No viable backend" in r["reason"] and ab._CPU_SDPA in r["reason"]
        if r["kernel"] == "vllm_fa3":
            assert r["status"] == "unavailable"
            assert r["reason"].startswith("import vllm.vllm_flash_attn failed") or "needs CUDA" in r["reason"]
        if r["kernel"] == "flex":
            assert "eager" in r["note"]


def test_decode_panel_tiny_shapes(quick_cpu):
    rows, _ = quick_cpu
    decode = [r for r in rows if r["panel"] == "decode"]
    assert sorted({r["N"] for r in decode}) == list(ab.QUICK_CPU["decode_lens"])
    assert "flex" not in {r["kernel"] for r in decode}  # by default: it would compile once per KV length
    for r in decode:
        assert r["causal"] is False and r["kv_bytes"] == 2 * r["batch"] * r["heads"] * r["N"] * r["head_dim"] * 4
        if r["status"] == "ok":
            assert r["achieved_gbps"] == pytest.approx(r["kv_bytes"] / (r["median_ms"] / 1e3) / 1e9)
            assert r["pct_of_bandwidth"] is None
    assert {r["status"] for r in decode if r["kernel"] in ("naive", "sdpa_math", "sdpa_flash")} == {"ok"}


TINY = dict(device="cpu", head_dims=[64], hidden=128, tokens=128, repeats=1, warmup=0, panels=["prefill"])


def test_the_command_line_writes_one_json_document(tmp_path, capsys):
    path = tmp_path / "attention.json"
    ab.main(["--quick", "--device", "cpu", "--kernels", "naive", "sdpa_cudnn", "--panels", "prefill", "--out", str(path)])
    doc = json.loads(path.read_text())
    assert [r["N"] for r in doc["rows"] if r["kernel"] == "naive"] == list(ab.QUICK_CPU["seq_lens"])
    assert doc["provenance"]["config"]["quick"] is True
    table = capsys.readouterr().out
    assert "naive" in table and "unavailable (RuntimeError: No viable backend" in table


def test_lengths_past_dense_max_len_run_only_tiled_kernels():
    rows, _ = ab.run_attention_bench(["naive", "sdpa_math", "sdpa_flash"], seq_lens=[64, 128], dense_max_len=64, **TINY)
    assert sorted((r["kernel"], r["N"]) for r in rows) == [
        ("naive", 64), ("sdpa_flash", 64), ("sdpa_flash", 128), ("sdpa_math", 64)]


def test_an_oom_is_marked_and_the_sweep_goes_on(monkeypatch):
    real, calls = ab.kernel, {"n": 0}

    def oom_on_third_call(q, k, v, causal):  # the probe and one warm-up pass: the OOM comes mid-measurement
        calls["n"] += 1
        if calls["n"] >= 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")
        return ab.naive(q, k, v, causal)

    monkeypatch.setattr(ab, "kernel", lambda name, **kw: oom_on_third_call if name == "naive" else real(name, **kw))
    rows, _ = ab.run_attention_bench(["naive", "sdpa_flash"], seq_lens=[64, 128], **(TINY | {"warmup": 1}))
    naive = [r for r in rows if r["kernel"] == "naive"]
    assert [r["status"] for r in naive] == ["oom", "oom"] and "OutOfMemoryError" in naive[0]["reason"]
    assert naive[0]["median_ms"] is None
    assert [r["status"] for r in rows if r["kernel"] == "sdpa_flash"] == ["ok", "ok"]


def test_a_wrong_kernel_is_timed_and_marked_wrong(monkeypatch):
    real = ab.kernel
    zeros = lambda q, k, v, causal: torch.zeros_like(q)  # noqa: E731
    monkeypatch.setattr(ab, "kernel", lambda name, **kw: zeros if name == "naive" else real(name, **kw))
    (row,), _ = ab.run_attention_bench(["naive"], seq_lens=[64], **TINY)
    assert row["status"] == "wrong" and row["median_ms"] > 0 and not row["within_tol"] and "rtol" in row["reason"]


@pytest.mark.parametrize("kwargs, field", [
    ({"kernels": ["flash3"]}, "kernels"), ({"decode_kernels": ["naive", "fa4"]}, "decode_kernels"),
    ({"seq_lens": [100]}, "seq_lens"), ({"seq_lens": [0, 64]}, "seq_lens"), ({"seq_lens": []}, "seq_lens"),
    ({"decode_lens": [3]}, "decode_lens"), ({"head_dims": [60]}, "head_dims"), ({"head_dims": [512]}, "head_dims"),
    ({"repeats": 0}, "repeats"), ({"warmup": -1}, "warmup"), ({"dtype": "fp8"}, "dtype"), ({"device": "tpu"}, "device"),
    ({"tokens": 0}, "tokens"), ({"panels": ["prefil"]}, "panels"), ({"causal": "yes"}, "causal"),
])
def test_bad_arguments_are_refused_naming_the_field_before_any_work(kwargs, field, monkeypatch):
    monkeypatch.setattr(ab, "_inputs", lambda *a: pytest.fail("work started before the arguments were checked"))
    with pytest.raises(ValueError) as e:
        ab.run_attention_bench(**({"device": "cpu"} | kwargs))
    m = SHAPE.fullmatch(str(e.value))
    assert m and m.group(1) == field, str(e.value)


def test_an_unknown_kernel_lists_the_allowed_ones():
    with pytest.raises(ValueError) as e:
        ab.run_attention_bench(["flash3"], device="cpu")
    assert all(repr(name) in str(e.value) for name in ab.KERNELS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_refused_where_there_is_none():
    with pytest.raises(ValueError, match=r"run_attention_bench\.device='cuda': allowed 'cpu' here"):
        ab.run_attention_bench(device="cuda")


def test_vllm_fa3_is_unavailable_here_with_a_reason():
    with pytest.raises(ab.Unavailable) as e:
        ab.kernel("vllm_fa3", device="cpu")
    if importlib.util.find_spec("vllm") is None:
        assert str(e.value).startswith("import vllm.vllm_flash_attn failed: ModuleNotFoundError")
    else:
        assert "needs CUDA" in str(e.value) or "vllm.vllm_flash_attn" in str(e.value)


def test_peaks_from_the_device_name():
    assert ab._peaks("NVIDIA H200", None, None)["peak_flops"] == H200.peak_flops
    assert ab._peaks("NVIDIA H200", None, None)["hbm_bandwidth"] == H200.hbm_bandwidth
    h100 = ab._peaks("NVIDIA H100 80GB HBM3", None, None)
    assert h100["peak_flops"] and "GPU_PEAKS" in h100["peak_source"]
    assert ab._peaks(None, None, None)["peak_flops"] is None
    assert ab._peaks("Some GPU", 1e15, None)["peak_flops"] == 1e15


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run on the GPU machine: pytest -m gpu)")
def test_quick_preset_on_the_gpu():
    rows, prov = ab.run_attention_bench(quick=True)
    out = os.environ.get("LABLIB_GPU_OUT") or os.environ.get("OUT")
    if out:  # keep the measurement: a failing check is understood from its data
        Path(out, "attention_quick.json").write_text(json.dumps({"rows": rows, "provenance": prov}, default=str))
    print("\n" + ab.format_table(rows))
    assert not [r for r in rows if r["status"] == "wrong"], [r for r in rows if r["status"] == "wrong"]
    assert all(r["within_tol"] for r in rows if r["status"] == "ok")
    prefill = [r for r in rows if r["panel"] == "prefill"]
    at = {(r["kernel"], r["N"]): r for r in prefill}
    for n in sorted({r["N"] for r in prefill if r["N"] >= 4096}):
        naive = at[("naive", n)]
        assert at[("sdpa_flash", n)]["status"] == "ok"
        if importlib.util.find_spec("vllm") is not None:
            assert at[("vllm_fa3", n)]["status"] == "ok", at[("vllm_fa3", n)]["reason"]
        if naive["status"] == "ok":
            for name in ab.TILED:
                if at[(name, n)]["status"] == "ok":
                    assert at[(name, n)]["median_ms"] < naive["median_ms"], (name, n)
    top = max(r["N"] for r in prefill)
    naive = at[("naive", top)]
    s_and_p = naive_traffic(AttentionShape(top, naive["head_dim"], naive["batch"], naive["heads"], causal=True))
    assert naive["status"] == "oom" or naive["extra_mem_bytes"] >= 0.9 * s_and_p.extra_bytes
    flash = at[("sdpa_flash", top)]
    assert flash["extra_mem_bytes"] < 0.1 * s_and_p.extra_bytes  # O(N): the output and the logsumexp
    assert prov["peak_flops"] and all(r["pct_of_peak"] is not None for r in prefill if r["status"] == "ok")
