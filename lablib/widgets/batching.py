"""Interactive panels for the labs: set the knobs, press Run, watch the numbers arrive.

A panel is wiring, not logic: every handler makes one call into lablib (bench.run, the
figure builders in `lablib.plots`, the arithmetic in `lablib.mechanisms.kv`), so what a
user does with the controls is exactly what a notebook cell or the CLI would do, and the
panels are tested by calling their handlers directly, with no browser.

- `BatchingPanel` runs a workload on Hugging Face `generate`, naive or statically batched,
  draws each request as it finishes (so a slow run is visibly alive), then the throughput
  of every run made in the panel against batch size. Each Result is appended to a
  ResultStore the moment it exists. Settings that cannot work (a batch of 0, an output
  length of 0) are refused with the config's own message, shown in the panel, before any
  model loads.
- `KVCalculator` shows the KV-cache size arithmetic live: bytes per token and the total
  for a batch of sequences, with presets of real architectures.
- `VRAMChart` draws the GPU's memory in use (NVML) while engines start, run and close,
  with a mark where each one closed: the picture of "back to baseline" during a sweep.

The live figure is a `plotly.graph_objects.FigureWidget` (it needs the `anywidget` package);
without it the panel falls back to a static figure redrawn in an Output area.
"""
from __future__ import annotations

import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from .. import plots
from ..bench.offline import run as bench_run
from ..config import HF_MODES, BenchConfig, HFConfig
from ..engines.hf import HFEngine
from ..models import EMBEDDED, PRESETS
from ..results.record import RequestRecord, Result
from ..results.store import ResultStore
from ..workloads import list_workloads, load_workload

GIB = 2**30


def _figure() -> tuple[go.Figure, widgets.Widget, bool]:
    """(figure, the widget that shows it, whether it updates live by itself)."""
    try:
        fig = go.FigureWidget()
        return fig, fig, True
    except ImportError:  # plotly's FigureWidget needs anywidget
        return go.Figure(), widgets.Output(), False


class BatchingPanel:
    """Run HF naive / static batching from controls; live per-request plot, then throughput vs batch size."""

    def __init__(self, lab: str = "01_batching", store: str | Path | None = None, model: str = "embedded",
                 requests: int = 8, max_new_tokens: int | None = 16, max_engines: int = 4):
        self.lab = lab
        self.store = ResultStore(store if store is not None else Path("results") / f"{lab}.jsonl")
        self.results: list[Result] = []  # every run made in this panel, in order
        self.last_error: str | None = None
        self.max_engines = max_engines
        self._engines: OrderedDict[tuple[str, str, int], HFEngine] = OrderedDict()
        names = list_workloads()
        self.model = widgets.Combobox(value=model, options=sorted(EMBEDDED) + sorted(PRESETS),
                                      ensure_option=False, description="model")
        self.workload = widgets.Dropdown(options=names, value="journey" if "journey" in names else names[0],
                                         description="workload")
        self.requests = widgets.IntSlider(value=requests, min=1, max=64, description="requests")
        self.mode = widgets.ToggleButtons(options=list(HF_MODES), value="naive", description="engine")
        self.batch_size = widgets.IntSlider(value=1, min=1, max=64, description="batch size", disabled=True)
        self.override = widgets.Checkbox(value=max_new_tokens is not None, description="fixed output length")
        self.max_new_tokens = widgets.IntText(value=max_new_tokens or 16, description="max new tokens",
                                              disabled=max_new_tokens is None)
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.status = widgets.HTML()
        self.errors = widgets.Output()
        self.figure, self.plot_area, self._live = _figure()
        self.run_button.on_click(self.run_clicked)
        self.mode.observe(self.mode_changed, names="value")
        self.override.observe(self.override_changed, names="value")
        self.widget = widgets.VBox([
            widgets.HBox([self.model, self.workload]), widgets.HBox([self.mode, self.batch_size]),
            widgets.HBox([self.requests, self.override, self.max_new_tokens]),
            widgets.HBox([self.run_button, self.status]), self.errors, self.plot_area])

    # handlers: one call each
    def run_clicked(self, _button: Any) -> Result | None:
        return self.run()

    def mode_changed(self, change: dict) -> None:
        self.batch_size.disabled = change["new"] == "naive"

    def override_changed(self, change: dict) -> None:
        self.max_new_tokens.disabled = not change["new"]

    def settings(self) -> dict[str, Any]:
        """The run the controls describe (naive generate always runs batch 1)."""
        return {"model": self.model.value, "workload": self.workload.value, "requests": self.requests.value,
                "mode": self.mode.value, "batch_size": 1 if self.mode.value == "naive" else self.batch_size.value,
                "max_new_tokens": self.max_new_tokens.value if self.override.value else None}

    def run(self, **overrides: Any) -> Result | None:
        """One benchmark run with the controls' settings (keys of `settings()` override them).

        Returns the Result, or None when the run could not be made; the reason is shown
        in the panel and kept in `last_error`.
        """
        s = self.settings() | overrides
        self.errors.clear_output()
        self.last_error = None
        self.run_button.disabled = True
        try:
            hf = HFConfig(mode=s["mode"], batch_size=s["batch_size"])
            bench = BenchConfig(max_new_tokens=s["max_new_tokens"], progress=False)
            workload = load_workload(s["workload"], limit=s["requests"])
            step = "hf-naive" if hf.mode == "naive" else f"hf-static-b{hf.batch_size}"
            self.status.value = f"loading <b>{s['model']}</b> ({hf.engine}, batch {hf.batch_size})..."
            engine = self._engine(s["model"], hf)
            self._start_live(step, len(workload.requests))
            result = bench_run(engine, workload, bench, lab=self.lab, step=step, store=self.store,
                               on_record=self.record_finished)
        except (ValueError, OSError) as e:
            return self._fail(f"Cannot run these settings: {e}")
        except Exception as e:  # a handler's exception is otherwise lost in the browser console
            return self._fail(f"The run failed: {type(e).__name__}: {e}", traceback.format_exc())
        finally:
            self.run_button.disabled = False
        self.results.append(result)
        self.status.value = self._summary(result)
        self.show(plots.throughput_vs_batch(self.results))
        return result

    def record_finished(self, rec: RequestRecord) -> None:
        """on_record for bench.run: add one finished request to the live figure."""
        ttft, e2e = self.figure.data[0], self.figure.data[1]
        n = len(e2e.x or ()) + 1
        with self._batch():
            ttft.x, ttft.y = (*(ttft.x or ()), n), (*(ttft.y or ()), rec.ttft)
            e2e.x, e2e.y = (*(e2e.x or ()), n), (*(e2e.y or ()), rec.e2e)
            self.figure.layout.title.text = f"{self._running}: {n}/{self._total} requests finished"
        self.status.value = f"running <b>{self._running}</b>: {n}/{self._total} requests finished"
        self._redraw()

    def show(self, fig: go.Figure) -> None:
        """Replace what the panel's figure shows with fig."""
        with self._batch():
            self.figure.data = ()
            self.figure.add_traces(fig.data)
            self.figure.layout = fig.layout
        self._redraw()

    def display(self) -> widgets.VBox:
        """The panel; as the last line of a cell it shows itself."""
        return self.widget

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def _engine(self, model: str, hf: HFConfig) -> HFEngine:
        """A cached engine per (model, mode, batch size); engines of another model are closed first."""
        key = (model, hf.mode, hf.batch_size)
        if key in self._engines:
            self._engines.move_to_end(key)
            return self._engines[key]
        for old in [k for k in self._engines if k[0] != model]:
            self._engines.pop(old).close()
        while len(self._engines) >= self.max_engines:
            self._engines.popitem(last=False)[1].close()
        self._engines[key] = engine = HFEngine(model, hf)
        return engine

    def _start_live(self, step: str, total: int) -> None:
        self._running, self._total = step, total
        live = go.Figure()
        live.add_scatter(x=[], y=[], mode="markers", name=f"{step}: time to first token")
        live.add_scatter(x=[], y=[], mode="lines+markers", name=f"{step}: end-to-end latency")
        live.update_layout(title=f"{step}: 0/{total} requests finished", xaxis_title="requests finished",
                           yaxis_title="seconds since the run started", yaxis_rangemode="tozero")
        self.show(live)

    def _batch(self) -> Any:
        from contextlib import nullcontext

        return self.figure.batch_update() if self._live else nullcontext()

    def _redraw(self) -> None:
        if not self._live:
            from IPython.display import display

            with self.plot_area:
                self.plot_area.clear_output(wait=True)
                display(self.figure)

    def _fail(self, message: str, details: str | None = None) -> None:  # returns None for run()
        self.last_error = message
        self.status.value = "<b style='color:#c00'>not run</b>"
        self.errors.append_stdout(message + "\n")
        if details:
            self.errors.append_stderr(details)
        return None

    @staticmethod
    def _summary(r: Result) -> str:
        s = r.summary
        ttft = s["ttft_s"]["p50"]
        return (f"<b>{r.label}</b>: {s['output_tok_s']:.1f} output tok/s over {s['requests']} requests, "
                f"TTFT p50 {ttft * 1e3:.0f} ms" if ttft is not None else f"<b>{r.label}</b> done")


