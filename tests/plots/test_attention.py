"""Lab 02's figures (lablib.plots.attention) under the figure rules of tests/plots/test_rules.py, and what each must show.

Drawn from this CPU's quick microbenchmark and HF prefill (live here), from the same runs standing in for H200
recordings (relabelled bf16 on CUDA, with extra memory from the IO model and the top naive point out of memory:
the GPU-only parts of each figure, i.e. memory panels, peak lines, OOM marks, the IO model beside the measurement),
from the IO model, and with nothing recorded. The rules (with tests/plots/rules.py's instruments): one colour per legend
name in every figure, units on every numeric axis, no provenance in a legend, provenance stated once, decades on log
axes.
"""
from __future__ import annotations

import copy
import math

import plotly.graph_objects as go
import pytest

pytest.importorskip("torch")

from lablib.experiments.attention import findings, study
from lablib.mechanisms.attention import H200  # noqa: E402
from lablib.plots import attention as P  # noqa: E402
from lablib.session import Shown  # noqa: E402
from tests.plots import rules  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread")]
NOT_RECORDED = Shown(None, False, "attention is not recorded yet: a GPU session records it with `scripts/...`")
HF_NOT_RECORDED = "attention.hf_prefill is not recorded yet: a GPU session records it with `scripts/...`"


def as_h200(here: Shown) -> Shown:
    """The CPU run standing in for an H200 bf16 recording (see the module docstring)."""
    v = copy.deepcopy({k: here.value[k] for k in ("rows", "provenance")})
    v["provenance"].update(device="NVIDIA H200", peak_flops=H200.peak_flops, hbm_bandwidth=H200.hbm_bandwidth,
                           date="2026-12-02T10:00:00+00:00", peak_source="lablib.mechanisms.attention.H200")
    v["provenance"]["config"].update(dtype="bf16", device="cuda")
    top = max(r["N"] for r in v["rows"] if r["panel"] == "prefill")
    for r in v["rows"]:
        if r["status"] == "ok":
            dense = r["kernel"] in ("naive", "sdpa_math")
            r["extra_mem_bytes"] = 4 * r["batch"] * r["heads"] * r["N"] * (r["N"] if dense else r["head_dim"])
            if r["panel"] == "prefill" and r["kernel"] == "naive" and r["N"] == top:
                r.update(status="oom", reason="OutOfMemoryError: CUDA out of memory", median_ms=None, tflops=None)
    return Shown(findings.with_prediction(v), False, "recorded on NVIDIA H200, 2026-12-02")


def hf_as_h200(hf: Shown) -> Shown:
    v = copy.deepcopy(hf.value)
    v["provenance"].update(synthetic=True, model="synthetic:llama-3.1-8b")
    for r in v["rows"]:
        if r["status"] == "ok":
            r["extra_mem_bytes"] = r["prompt_tokens"] ** 2 * 64 * (4 if r["impl"] == "eager" else 1)
    last_eager = max((r for r in v["rows"] if r["impl"] == "eager"), key=lambda r: r["prompt_tokens"])
    last_eager.update(status="oom", reason="OutOfMemoryError: CUDA out of memory", median_ms=None)
    return Shown(v, False, "recorded on NVIDIA H200, 2026-12-02")


@pytest.fixture(scope="module")
def figures() -> dict[str, go.Figure]:
    here = study.kernels_here(seq_lens=[64, 128, 256], decode_lens=[256, 4096], repeats=1, warmup=0)
    hf = Shown(study.hf_prefill("embedded", prompt_lens=[32, 64, 128], device="cpu", repeats=1, warmup=0), True,
               study.CPU_LABEL)
    gpu, hf_gpu = as_h200(here), hf_as_h200(hf)
    return {
        "prediction_figure": P.prediction_figure(findings.prediction()),
        "kernel_sweep_figure/cpu": P.kernel_sweep_figure(here), "kernel_sweep_figure/h200": P.kernel_sweep_figure(gpu),
        "kernel_sweep_figure/none": P.kernel_sweep_figure(NOT_RECORDED),
        "tflops_figure/cpu": P.tflops_figure(here), "tflops_figure/h200": P.tflops_figure(gpu),
        "tflops_figure/none": P.tflops_figure(NOT_RECORDED),
        "decode_figure/cpu": P.decode_figure(here), "decode_figure/h200": P.decode_figure(gpu),
        "decode_figure/none": P.decode_figure(NOT_RECORDED),
        "hf_prefill_figure/cpu": P.hf_prefill_figure(hf), "hf_prefill_figure/h200": P.hf_prefill_figure(hf_gpu),
        "hf_prefill_figure/none": P.hf_prefill_figure(Shown(None, False, HF_NOT_RECORDED)),
    }


def test_every_builder_is_drawn(figures):
    assert rules.builders(P) == {k.split("/")[0] for k in figures}


def test_legend_names_are_unique_coloured_and_one_colour_each_everywhere(figures):
    for key, fig in figures.items():
        rules.check_legend(key, fig)
        assert not [t.name for t in rules.legend(fig) if rules.PROVENANCE.search(t.name)], key
    assert rules.colour_clashes(figures) == {}
    kernels = [P.series_colour(k) for k in P.KERNELS]
    assert len(set(kernels)) == len(kernels)  # drawn side by side: never two kernels in one colour


def test_every_numeric_axis_has_a_unit_and_decades_sit_on_log_axes(figures):
    for key, fig in figures.items():
        for name, axis, values in rules.axes(fig):
            if rules.numeric(axis, values):
                assert rules.UNIT.search(axis.title.text or ""), f"{key}.{name}: {axis.title.text!r}"
            if rules.numeric(axis, values) and rules.spans_decades(values):
                assert axis.type == "log", f"{key}.{name}"
        assert fig.layout.xaxis.automargin and fig.layout.yaxis.automargin


def test_provenance_is_stated_once_in_the_title(figures):
    for key, fig in figures.items():
        if key.endswith("/none"):
            label = HF_NOT_RECORDED if key.startswith("hf") else NOT_RECORDED.label
            said = rules.texts(fig)
            assert sum(t.count(label) for t in said) == 1 and "nothing recorded yet" in " ".join(said)
            continue
        stated = rules.stating(fig)
        assert len(stated) == 1 and stated[0] == fig.layout.title.text, f"{key}: {stated}"


def _trace(fig, name, col=1):
    axis = "x" if col == 1 else f"x{col}"
    return next(t for t in fig.data if t.name == name and (t.xaxis or "x") == axis)


def test_the_slope_guides_have_slopes_two_and_one(figures):
    for key in ("prediction_figure", "kernel_sweep_figure/h200"):
        fig = figures[key]
        for name, k in (("O(N²) slope", 2), ("O(N) slope", 1)):
            for t in (t for t in fig.data if t.name == name):
                (x0, x1), (y0, y1) = t.x, t.y
                assert math.log(y1 / y0) / math.log(x1 / x0) == pytest.approx(k)


def test_the_prediction_figure_shows_n_squared_memory_for_naive_only(figures):
    fig = figures["prediction_figure"]
    naive, flash = _trace(fig, "IO model: naive", 2), _trace(fig, "IO model: FA2", 2)
    assert naive.y[-1] / naive.y[0] == pytest.approx((naive.x[-1] / naive.x[0]) ** 2)
    assert flash.y[-1] / flash.y[0] == pytest.approx(flash.x[-1] / flash.x[0])


def test_the_h200_sweep_shows_memory_the_model_and_the_oom(figures):
    fig = figures["kernel_sweep_figure/h200"]
    assert {t.xaxis for t in fig.data} == {"x", "x2"}  # time and extra memory
    oom = next(t for t in fig.data if t.name == "out of memory")
    assert list(oom.x) == [256] and "naive" in oom.text[0] and oom.y[0] > max(_trace(fig, "naive").y)
    assert _trace(fig, "IO model: FA2").x == (64, 128, 256)
    cpu = figures["kernel_sweep_figure/cpu"]
    assert {t.xaxis for t in cpu.data} == {"x"} and not [t for t in cpu.data if t.name.startswith("IO model")]
    notes = " ".join(a.text for a in cpu.layout.annotations)
    assert "not run: sdpa_cudnn" in notes and "measured on CUDA only" in notes and "no IO-model line" in notes


def test_peak_lines_come_from_the_provenance(figures):
    peak = _trace(figures["tflops_figure/h200"], "bf16 tensor peak")
    assert set(peak.y) == {H200.peak_flops / 1e12}
    hbm = _trace(figures["decode_figure/h200"], "HBM peak")
    assert set(hbm.y) == {H200.hbm_bandwidth / 1e9}
    assert not [t for t in figures["tflops_figure/cpu"].data if t.name == "bf16 tensor peak"]
    assert not [t for t in figures["decode_figure/cpu"].data if t.name == "HBM peak"]


def test_the_hf_figure_marks_skips_ooms_and_synthetic_weights(figures):
    cpu, gpu = figures["hf_prefill_figure/cpu"], figures["hf_prefill_figure/h200"]
    assert {t.name for t in rules.legend(cpu)} == {"eager", "sdpa"}
    assert "not run: flex_attention" in " ".join(a.text for a in cpu.layout.annotations)
    assert "synthetic weights" in gpu.layout.title.text and "synthetic weights" not in cpu.layout.title.text
    assert list(next(t for t in gpu.data if t.name == "out of memory").x) == [128]
    assert {t.xaxis for t in gpu.data} == {"x", "x2"}


def test_a_head_dim_not_measured_is_refused(figures):
    here = study.kernels_here(seq_lens=[64], decode_lens=[256], repeats=1, warmup=0, kernels=["naive"])
    with pytest.raises(ValueError, match=r"head_dim=128: this run measured head dims \[64\]"):
        P.kernel_sweep_figure(here, head_dim=128)
    with pytest.raises(ValueError, match="prediction_figure: no rows"):
        P.prediction_figure([])


def test_every_figure_fits_a_1024_px_page(figures):
    assert not {key: unfit for key, fig in figures.items() if (unfit := rules.unfit_text(fig))}
