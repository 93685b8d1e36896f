"""The panels, headless: set the controls, call the handlers, check the store, the figure and what the browser gets.

The real HFEngine runs the embedded model on the CPU: two requests, four new tokens. What a browser draws is
the panel's Output widget state (`outputs`: one display_data with plotly's JSON), the same state a page
reloaded after a refresh fetches from the kernel; the tests read it back from there.
"""
import html
import math

import ipywidgets
import pytest

from lablib import widgets
from lablib.models import architectures
from lablib.plots.style import colour
from lablib.results import RequestRecord, ResultStore
from lablib.widgets import batching as batching_widgets
from lablib.widgets import kv as kv_widgets
from lablib.widgets.figure import PLOTLY_MIME, FigureArea


def _shown(area_output: ipywidgets.Output) -> dict:
    """The plotly figure an Output widget holds, from its synced state (what a reloaded page receives)."""
    state = area_output.get_state()
    assert len(state["outputs"]) == 1 and state["outputs"][0]["output_type"] == "display_data"
    return state["outputs"][0]["data"][PLOTLY_MIME]


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    path = tmp_path_factory.mktemp("results") / "lab.jsonl"
    return widgets.BatchingPanel(lab="test_widgets", store=path, requests=2, max_new_tokens=4)


def test_before_any_run_the_panel_shows_labelled_axes_and_says_what_to_do(panel):
    shown = _shown(panel.plot_area)
    assert shown["data"] == [] and "press Run" in shown["layout"]["annotations"][0]["text"]
    assert shown["layout"]["xaxis"]["title"]["text"] == "batch size (sequences decoding together)"
    assert shown["layout"]["yaxis"]["title"]["text"] == "output throughput (tok/s)"
    assert "no runs" in panel.status.value


def test_controls_that_do_not_apply_are_hidden(panel):
    assert panel.mode.value == "naive" and panel.batch_size.layout.display == "none"  # naive generate is batch 1
    panel.mode.value = "static"
    assert panel.batch_size.layout.display is None and not panel.batch_size.disabled
    panel.mode.value = "naive"
    assert panel.batch_size.layout.display == "none" and panel.settings()["batch_size"] == 1
    panel.override.value = False
    assert panel.max_new_tokens.layout.display == "none" and panel.settings()["max_new_tokens"] is None
    panel.override.value = True
    assert panel.max_new_tokens.layout.display is None and panel.settings()["max_new_tokens"] == 4


def test_runs_store_results_and_draw_throughput_vs_batch(panel):
    result = panel.run_clicked(None)
    assert panel.last_error is None and result is not None
    stored = ResultStore(panel.store.path).load()
    assert [r.step for r in stored] == ["hf-naive"] and stored[0].summary["output_tokens"] == 2 * 4
    assert [t["name"] for t in _shown(panel.plot_area)["data"]] == ["hf-naive"]

    panel.mode.value = "static"
    panel.batch_size.value = 2
    panel.run_clicked(None)
    panel.mode.value = "naive"
    panel.run_clicked(None)  # the cached naive engine is reused, not reloaded
    assert [r.step for r in ResultStore(panel.store.path).load()] == ["hf-naive", "hf-static-b2", "hf-naive"]
    assert len(panel._engines) == 2
    shown = _shown(panel.plot_area)
    assert [t["name"] for t in shown["data"]] == ["hf-naive", "hf-static"]
    assert shown["data"][1]["x"] == [2]
    assert shown["data"][1]["y"][0] == pytest.approx(panel.results[1].summary["output_tok_s"])
    assert shown["data"][1]["line"]["color"] == colour("hf-static")  # the engine's colour in every figure
    assert "live on this CPU" in shown["layout"]["title"]["text"]
    assert "output tok/s" in panel.status.value


def test_live_figure_grows_one_point_per_finished_request_and_the_browser_gets_it(panel):
    panel._start_live("hf-static-b2", total=2)
    assert [t["x"] for t in _shown(panel.plot_area)["data"]] == [[], []]  # axes up before the first request ends
    for i, done in enumerate((0.4, 0.5)):
        panel.record_finished(RequestRecord(f"r{i}", 5, 4, first_token=0.1 * (i + 1), last_token=done, finished=done))
    ttft, e2e = panel.figure.data
    assert list(ttft.x) == [1, 2] and list(ttft.y) == pytest.approx([0.1, 0.2])
    assert list(e2e.y) == pytest.approx([0.4, 0.5])
    shown = _shown(panel.plot_area)  # the last request is always sent, whatever the throttle
    assert shown["data"][1]["y"] == pytest.approx([0.4, 0.5]) and shown["data"][0]["x"] == [1, 2]
    assert "2/2 requests finished" in shown["layout"]["title"]["text"]
    assert shown["layout"]["yaxis"]["title"]["text"] == "time since the run started (s)"


def test_the_figure_is_widget_state_that_a_reloaded_page_fetches(panel):
    """No FigureWidget (its anywidget model cannot be rebuilt after a refresh): an Output holding a static figure."""
    assert isinstance(panel.plot_area, ipywidgets.Output)
    assert not any(isinstance(w, ipywidgets.DOMWidget) and type(w).__name__ == "FigureWidget"
                   for w in panel.widget.children)
    before = panel.area.renders
    panel.show(panel.figure)
    assert panel.area.renders == before + 1 and _shown(panel.plot_area)["data"][0]["name"] == "time to first token"


def test_a_new_panel_starts_from_the_runs_already_in_its_store(panel):
    again = widgets.BatchingPanel(lab="test_widgets", store=panel.store.path, requests=2, max_new_tokens=4)
    assert [r.step for r in again.results] == ["hf-static-b2", "hf-naive"]  # the latest run of each step
    shown = _shown(again.plot_area)
    assert sorted(t["name"] for t in shown["data"]) == ["hf-naive", "hf-static"]
    assert "2 earlier runs" in again.status.value
    other = widgets.BatchingPanel(lab="test_widgets", store=panel.store.path, model="embedded-draft")
    assert other.results == [] and _shown(other.plot_area)["data"] == []  # runs of another model are not mixed in


@pytest.mark.parametrize("overrides, message", [
    ({"mode": "static", "batch_size": 0}, "HFConfig.batch_size=0"),
    ({"max_new_tokens": 0}, "BenchConfig.max_new_tokens=0"),
    ({"model": "no-such-model"}, "not a known model"),
    ({"model": "embeded"}, "Fix: model='embedded'"),
    ({"workload": "no-such-set"}, "unknown workload"),
])
def test_bad_settings_are_shown_not_raised(panel, overrides, message):
    before = len(ResultStore(panel.store.path).load())
    assert panel.run(**overrides) is None
    assert message in panel.last_error and panel.last_error.startswith("Cannot run these settings")
    assert "not run" in panel.status.value
    assert html.escape(message) in panel.message.get_state()["value"]  # on the page, not only in last_error
    assert panel.errors.outputs == ()  # an expected refusal: no traceback
    assert len(ResultStore(panel.store.path).load()) == before
    assert not panel.run_button.disabled


def test_a_good_run_after_a_refusal_clears_the_message(panel):
    panel.run(model="embeded")
    assert panel.message.value and panel.run() is not None
    assert panel.last_error is None and panel.message.value == "" and "output tok/s" in panel.status.value


class _Interrupting:
    """Wraps the panel's on_record: Kernel → Interrupt arrives after `after` requests have finished."""

    def __init__(self, panel: widgets.BatchingPanel, after: int):
        self.panel, self.after, self.seen = panel, after, 0
        self.draw = panel.record_finished

    def __call__(self, rec: RequestRecord) -> None:
        self.draw(rec)
        self.seen += 1
        if self.seen == self.after:
            raise KeyboardInterrupt


@pytest.mark.parametrize("after", [1, 0])
def test_an_interrupted_run_says_what_was_kept_and_draws_no_partial_run(tmp_path, monkeypatch, after):
    """Kernel → Interrupt in a cell's panel.run: the cell still stops (a KeyboardInterrupt), the panel says what was
    kept, the interrupted engine is dropped (bench.run closed it), and the chart draws whole runs only."""
    from lablib.bench.offline import RunInterrupted

    p = widgets.BatchingPanel(lab="test_widgets", store=tmp_path / "r.jsonl", requests=3, max_new_tokens=4)
    assert p.run() is not None
    whole = _shown(p.plot_area)["data"]
    monkeypatch.setattr(p, "record_finished", _Interrupting(p, after) if after else p.record_finished)
    if not after:  # before the first request finishes: in the engine's generate, after the warm-up
        engine = next(iter(p._engines.values()))
        warm_up = engine.generate

        def generate(requests, on_record=None, progress=True):
            if on_record is None:
                return warm_up(requests, progress=progress)
            raise KeyboardInterrupt

        monkeypatch.setattr(engine, "generate", generate)
    with pytest.raises(RunInterrupted) as e:
        p.run()
    stored = ResultStore(p.store.path).load()
    if after:
        assert "after 1 of 3 requests: kept a Result of those 1, marked partial" in str(e.value)
        assert len(stored) == 2 and stored[-1].partial and stored[-1].summary["requests"] == 1
        assert "This chart leaves partial runs out." in p.last_error
    else:
        assert "after 0 of 3 requests: nothing was stored" in str(e.value)
        assert len(stored) == 1 and e.value.kept is None
    assert "interrupted" in p.status.value and html.escape(str(e.value)) in p.message.value
    assert p._engines == {} and not p.run_button.disabled  # the closed engine is not reused
    assert _shown(p.plot_area)["data"] == whole  # the runs before, not the interrupted one
    again = widgets.BatchingPanel(lab="test_widgets", store=p.store.path)
    assert [r.summary["requests"] for r in again.results] == [3]  # a new panel leaves the partial run out too


def test_an_interrupt_from_the_run_button_ends_the_handler_quietly(tmp_path, monkeypatch):
    p = widgets.BatchingPanel(lab="test_widgets", store=tmp_path / "r.jsonl", requests=2, max_new_tokens=4)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(batching_widgets, "HFEngine", interrupted)  # Kernel → Interrupt while the model loads
    assert p.run_clicked(None) is None
    assert "nothing was run or stored" in p.message.value and "interrupted" in p.status.value


def test_the_panel_needs_no_anywidget(monkeypatch, tmp_path):
    def no_anywidget(*a, **k):
        raise ImportError("Please install anywidget to use the FigureWidget class")

    monkeypatch.setattr(batching_widgets.go, "FigureWidget", no_anywidget)
    p = widgets.BatchingPanel(store=tmp_path / "r.jsonl")
    p._start_live("hf-naive", total=1)
    p.record_finished(RequestRecord("r0", 5, 4, first_token=0.1, last_token=0.3))
    assert _shown(p.plot_area)["data"][1]["y"] == [pytest.approx(0.3)]
    assert p.display() is p.widget


def test_figure_area_throttles_but_never_drops_a_forced_draw():
    import plotly.graph_objects as go

    area = FigureArea(go.Figure(), min_interval_s=60)
    assert area.renders == 1
    area.figure.add_scatter(x=[1], y=[2], name="a")
    assert area.show(force=False) is False and _shown(area.output)["data"] == []  # throttled: the old figure stays
    assert area.show() is True and _shown(area.output)["data"][0]["name"] == "a"


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
    assert calc.weight_bytes is None and "weights unknown" in calc.gpu_table.value
    calc.preset.value = "Qwen2.5-7B"
    calc.dtype.value = "bfloat16"
    assert calc.bytes_per_token == 2 * 28 * 4 * 128 * 2 and "28 layers" in calc.text.value
    assert calc.display() is calc.widget
    assert widgets.KVCalculator(preset="llama-3.1-8b").preset.value == "Llama-3.1-8B"  # the architectures' keys too
    with pytest.raises(ValueError, match="allowed 'Llama-3.1-8B'"):
        widgets.KVCalculator(preset="GPT-5")


def test_kv_calculator_covers_every_shipped_architecture():
    calc = widgets.KVCalculator()
    options = set(calc.preset.options) - {"custom"}
    assert len(options) == len(architectures()) + 2 and {"embedded target", "embedded draft"} <= options
    for key, cfg in architectures().items():
        calc.preset.value = kv_widgets._ALIASES[key]
        heads = cfg["num_attention_heads"]
        dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        assert calc.bytes_per_token == 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * dim * 2, key
        assert calc.preset.value != "custom", key  # every shape is reachable with the controls


def test_kv_calculator_shows_the_answer_against_common_gpus():
    calc = widgets.KVCalculator(preset="Llama-3.1-8B", context=8192, batch=8)  # 8 GiB of KV, 14.96 GiB of weights
    rows = {r["gpu"]: r for r in calc.gpus}
    assert list(rows) == ["T4 16 GB", "L4 24 GB", "A100 40 GB", "A100 80 GB", "H100 80 GB", "H200 141 GB"]
    assert [r["memory_GiB"] for r in rows.values()] == [16, 24, 40, 80, 80, 141]
    assert rows["T4 16 GB"]["kv_share"] == pytest.approx(0.5) and rows["H200 141 GB"]["kv_share"] == pytest.approx(8 / 141)
    assert not rows["T4 16 GB"]["fits"] and not rows["L4 24 GB"]["fits"] and rows["A100 40 GB"]["fits"]
    assert all(name in calc.gpu_table.value for name in rows) and "does not fit" in calc.gpu_table.value
    calc.batch.value = 64  # 64 GiB of KV: only the H200 holds it
    assert [r["gpu"] for r in calc.gpus if r["fits"]] == ["H200 141 GB"]
    calc.preset.value = "embedded target"
    assert all(r["fits"] for r in calc.gpus)


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
    shown = _shown(chart.widget)  # stop() sends the whole timeline to the browser
    assert shown["data"][0]["y"] == pytest.approx(chart.used_gib) and shown["layout"]["shapes"]
    assert shown["layout"]["yaxis"]["title"]["text"] == "GPU memory used (GiB)"


def test_vram_chart_without_a_gpu_says_so(no_gpu):
    chart = widgets.VRAMChart()
    with chart:
        pass
    assert chart.t == [] and "no NVIDIA GPU" in chart.note and not chart.available
    with pytest.raises(ValueError, match="interval_s"):
        widgets.VRAMChart(interval_s=0)


def test_code_sample_is_a_captioned_code_block_that_the_models_backticks_cannot_end():
    from lablib.widgets import code_sample

    md = code_sample("def f():\n    return 1", "the model's continuation").data
    assert md == "*the model's continuation*\n\n```python\ndef f():\n    return 1\n```"
    md = code_sample("x = '''```'''", "c").data
    assert md.splitlines()[2] == "````python" and md.endswith("\n````")


def test_live_server_metrics_redraws_an_output_widget_at_most_once_per_interval_and_agrees_with_its_figure():
    from lablib.plots.serving import LiveServerMetrics

    live = LiveServerMetrics(min_interval_s=3600)  # only a new rate may redraw (its colours change)
    names = live.names
    for rate in (1.0, 2.0, math.inf):
        for t in range(5):
            live.update(rate, {"t": t * 0.25, **{n: float(t) for n in names}})
    assert live.area.renders == 1 + 3  # the empty figure, then one per new rate: the scraper's thread stays quiet
    assert type(live.display()).__name__ == "Output"
    shown = live.area.shown()
    assert len(shown["data"]) == 3 * len(names) and len(shown["data"][0]["x"]) == 5  # rate 1's lines whole
    assert len(shown["data"][-1]["x"]) == 1  # the newest rate as it was when it arrived
    live.flush()  # between load tests (a sweep's on_result): every sample drawn
    assert len(live.area.shown()["data"][-1]["x"]) == 5 and live.area.renders == 5
    live.area.min_interval_s = 0  # due again: later samples redraw from the plain traces, x/y only
    live.update(math.inf, {"t": 2.0, **{n: 9.0 for n in names}})
    shown, fig = live.area.shown(), live.figure
    assert [list(t["y"]) for t in shown["data"]] == [list(t.y) for t in fig.data]
    assert [t["line"]["color"] for t in shown["data"]] == [t.line.color for t in fig.data]
