"""The panels, headless: set the controls, call the handlers, check the store and the figure.

The real HFEngine runs the embedded model on the CPU: two requests, four new tokens.
"""
import pytest

from lablib import widgets
from lablib.widgets import batching as batching_widgets
from lablib.results import RequestRecord, ResultStore


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    path = tmp_path_factory.mktemp("results") / "lab.jsonl"
    return widgets.BatchingPanel(lab="test_widgets", store=path, requests=2, max_new_tokens=4)


def test_runs_store_results_and_draw_throughput_vs_batch(panel):
    assert panel.batch_size.disabled  # naive generate is always batch 1
    result = panel.run_clicked(None)
    assert panel.last_error is None and result is not None
    stored = ResultStore(panel.store.path).load()
    assert [r.step for r in stored] == ["hf-naive"] and stored[0].summary["output_tokens"] == 2 * 4
    assert [t.name for t in panel.figure.data] == ["hf-naive"]

    panel.mode.value = "static"
    assert not panel.batch_size.disabled
    panel.batch_size.value = 2
    panel.run_clicked(None)
    panel.mode.value = "naive"
    panel.run_clicked(None)  # the cached naive engine is reused, not reloaded
    assert [r.step for r in ResultStore(panel.store.path).load()] == ["hf-naive", "hf-static-b2", "hf-naive"]
    assert len(panel._engines) == 2
    names = [t.name for t in panel.figure.data]
    assert names == ["hf-naive", "hf-static"]
    assert list(panel.figure.data[1].x) == [2]
    assert panel.figure.data[1].y[0] == pytest.approx(panel.results[1].summary["output_tok_s"])
    assert "output tok/s" in panel.status.value


def test_live_figure_grows_one_point_per_finished_request(panel):
    panel._start_live("hf-static-b2", total=2)
    for i, done in enumerate((0.4, 0.5)):
        panel.record_finished(RequestRecord(f"r{i}", 5, 4, first_token=0.1 * (i + 1), last_token=done, finished=done))
    ttft, e2e = panel.figure.data
    assert list(ttft.x) == [1, 2] and list(ttft.y) == pytest.approx([0.1, 0.2])
    assert list(e2e.y) == pytest.approx([0.4, 0.5])
    assert "2/2 requests finished" in panel.figure.layout.title.text


@pytest.mark.parametrize("overrides, message", [
    ({"mode": "static", "batch_size": 0}, "HFConfig.batch_size=0"),
    ({"max_new_tokens": 0}, "BenchConfig.max_new_tokens=0"),
    ({"model": "no-such-model"}, "not a known model"),
    ({"workload": "no-such-set"}, "unknown workload"),
])
def test_bad_settings_are_shown_not_raised(panel, overrides, message):
    before = len(ResultStore(panel.store.path).load())
    assert panel.run(**overrides) is None
    assert message in panel.last_error and panel.last_error.startswith("Cannot run these settings")
    assert message in panel.errors.outputs[-1]["text"]
    assert len(ResultStore(panel.store.path).load()) == before
    assert not panel.run_button.disabled


def test_fixed_output_length_control(panel):
    panel.override.value = False
    assert panel.max_new_tokens.disabled and panel.settings()["max_new_tokens"] is None
    panel.override.value = True
    assert panel.settings()["max_new_tokens"] == 4


def test_without_anywidget_the_panel_draws_a_static_figure(monkeypatch, tmp_path):
    def no_anywidget():
        raise ImportError("Please install anywidget to use the FigureWidget class")

    monkeypatch.setattr(batching_widgets.go, "FigureWidget", no_anywidget)
    p = widgets.BatchingPanel(store=tmp_path / "r.jsonl")
    assert not p._live and p.plot_area is not p.figure
    p._start_live("hf-naive", total=1)
    p.record_finished(RequestRecord("r0", 5, 4, first_token=0.1, last_token=0.3))
    assert list(p.figure.data[1].y) == [pytest.approx(0.3)]
    assert p.display() is p.widget


def test_kv_calculator_presets_and_live_numbers():
    calc = widgets.KVCalculator()  # Llama-3.1-8B, bf16, 8 sequences x 8192 tokens
    assert calc.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert calc.total_bytes == 131072 * 8192 * 8 and "8.00 GiB" in calc.text.value
    calc.preset.value = "embedded target"
    assert (calc.layers.value, calc.kv_heads.value, calc.head_dim.value) == (5, 2, 64)
    assert calc.bytes_per_token == 2 * 5 * 2 * 64 * 2 and calc.preset.value == "embedded target"
    calc.dtype.value = "fp8"
    assert calc.bytes_per_token == 2 * 5 * 2 * 64
    calc.layers.value = 6
    assert calc.preset.value == "custom" and calc.bytes_per_token == 2 * 6 * 2 * 64
    calc.preset.value = "Qwen2.5-7B"
    calc.dtype.value = "bfloat16"
    assert calc.bytes_per_token == 2 * 28 * 4 * 128 * 2 and "28 layers" in calc.text.value
    assert calc.display() is calc.widget
    with pytest.raises(ValueError, match="allowed 'Llama-3.1-8B'"):
        widgets.KVCalculator(preset="GPT-5")


def test_vram_chart_draws_nvml_samples_and_marks(fake_pynvml):
    import time

    chart = widgets.VRAMChart(interval_s=0.01)
    with chart:
        time.sleep(0.08)
        chart.mark("engine closed")
        time.sleep(0.03)
    n = len(chart.t)
    assert n >= 4 and chart.note is None and chart.t == sorted(chart.t)
    assert chart.used_gib == sorted(chart.used_gib) and chart.used_gib[-1] > chart.used_gib[0]  # the fake GPU's memory grows
    assert chart.total_gib == 141 and chart.marks[0][1] == "engine closed" and chart.t[0] <= chart.marks[0][0] <= chart.t[-1]
    time.sleep(0.05)
    assert len(chart.t) == n  # stopped: no more samples
    fig = chart.static_figure()
    assert list(fig.data[0].x) == chart.t and fig.layout.shapes  # the mark is a vertical line
    if chart._live:
        assert list(chart.figure.data[0].y) == chart.used_gib


def test_vram_chart_without_a_gpu_says_so(no_gpu):
    chart = widgets.VRAMChart()
    with chart:
        pass
    assert chart.t == [] and "no NVIDIA GPU" in chart.note and not chart.available
    with pytest.raises(ValueError, match="interval_s"):
        widgets.VRAMChart(interval_s=0)
