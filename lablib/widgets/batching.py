"""Lab 01's panel: set the knobs, press Run, watch the numbers arrive.

A panel is wiring, not logic: every handler makes one call into lablib (bench.run, the
figure builders in `lablib.plots`), so what a user does with the controls is exactly what a
notebook cell or the CLI would do, and the panels are tested by calling their handlers
directly, with no browser.

`BatchingPanel` runs a workload on Hugging Face `generate`, naive or statically batched,
draws each request as it finishes (so a slow run is visibly alive), then the throughput of
every run against batch size. It opens on the runs already in its ResultStore (the lab's
own journey cell writes to the same file), not on empty axes, and each new Result is
appended the moment it exists. Controls that do not apply are hidden: the batch size in
naive mode (naive generate is batch 1), the output length unless it is fixed. Settings
that cannot work (a batch of 0, an output length of 0, a mistyped model) are refused with the
config's own message ("allowed ...; Fix: ..."), written on the panel under the Run button, before
any model loads. Kernel → Interrupt during a run says there what was kept (`bench.offline.run`
stores the requests that finished as a Result marked partial); the chart, a chart of whole runs,
leaves partial runs out.

Why the figure survives a browser refresh: it is a static plotly figure redrawn whole into
an `ipywidgets.Output` on every change (`widgets.figure.FigureArea`), not a plotly
`FigureWidget`. An Output's content is kernel-side widget state that a reloaded page fetches
again and draws with the ordinary plotly renderer; a FigureWidget's front end (anywidget)
cannot be rebuilt after a reload and stays empty while the kernel keeps updating it.
"""
from __future__ import annotations

import html
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from .. import plots
from ..bench.offline import run as bench_run
from ..config import BenchConfig, HF_MODES, HFConfig, lab_id
from ..engines.hf import HFEngine
from ..models import EMBEDDED, PRESETS
from ..plots.style import colour, finish
from ..results.record import RequestRecord, Result
from ..results.store import ResultStore
from ..session import live_label
from ..workloads import list_workloads, load_workload
from .figure import FigureArea

GIB = 2**30
HF_ENGINES = ("hf-naive", "hf-static")
HIDDEN, SHOWN = "none", None  # widget.layout.display: a control that does not apply is not drawn at all


def empty_figure(title: str, xtitle: str, ytitle: str, message: str) -> go.Figure:
    """Labelled axes with a message in the middle: what a panel shows before it has anything to draw."""
    fig = go.Figure()
    fig.add_annotation(text=message, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font={"size": 14})
    fig.update_xaxes(title_text=xtitle, range=[0, 1], showticklabels=False)
    fig.update_yaxes(title_text=ytitle, range=[0, 1], showticklabels=False)
    return finish(fig, title, "")


class BatchingPanel:
    """Run HF naive / static batching from controls; live per-request plot, then throughput vs batch size."""

    def __init__(self, lab: str = lab_id("01"), store: str | Path | None = None, model: str = "embedded",
                 requests: int = 8, max_new_tokens: int | None = 16, max_engines: int = 4):
        self.lab = lab
        self.store = ResultStore(store) if store is not None else ResultStore.for_lab(lab)
        self.results: list[Result] = []  # what the throughput figure draws: earlier runs, then this panel's, in order
        self.last_error: str | None = None
        self.max_engines = max_engines
        self._engines: OrderedDict[tuple[str, str, int], HFEngine] = OrderedDict()
        self._running, self._total = "", 0
        names = list_workloads()
        self.model = widgets.Combobox(value=model, options=sorted(EMBEDDED) + sorted(PRESETS),
                                      ensure_option=False, description="model")
        self.workload = widgets.Dropdown(options=names, value="journey" if "journey" in names else names[0],
                                         description="workload")
        self.requests = widgets.IntSlider(value=requests, min=1, max=64, description="requests")
        self.mode = widgets.ToggleButtons(options=list(HF_MODES[:2]), value="naive", description="engine")  # lab 01
        self.batch_size = widgets.IntSlider(value=1, min=1, max=64, description="batch size")
        self.override = widgets.Checkbox(value=max_new_tokens is not None, description="fixed output length")
        self.max_new_tokens = widgets.IntText(value=max_new_tokens or 16, description="max new tokens",
                                              style={"description_width": "initial"})  # the label was clipped
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.status = widgets.HTML()
        self.message = widgets.HTML()  # why the last run did not run or stopped, on the page (not only in last_error)
        self.errors = widgets.Output()  # the traceback of an unexpected failure
        self.area = FigureArea(min_interval_s=0.25, height="450px")
        self.plot_area = self.area.output
        self.run_button.on_click(self.run_clicked)
        self.mode.observe(self.mode_changed, names="value")
        self.override.observe(self.override_changed, names="value")
        self._apply(self.mode.value, self.override.value)
        self.widget = widgets.VBox([
            widgets.HBox([self.model, self.workload]), widgets.HBox([self.mode, self.batch_size]),
            widgets.HBox([self.requests, self.override, self.max_new_tokens]),
            widgets.HBox([self.run_button, self.status]), self.message, self.errors, self.plot_area])
        self.load_earlier()

    @property
    def figure(self) -> go.Figure:
        """The figure the panel shows now (a plain plotly Figure; the browser gets it whole on every change)."""
        return self.area.figure

    def load_earlier(self) -> list[Result]:
        """Start from the runs already in the store: the latest HF run of each step on this model, drawn at once."""
        latest: dict[str, Result] = {}
        for r in self.store.load():  # a partial run's throughput is not its setting's: left out
            if r.engine in HF_ENGINES and r.model.get("name") == self.model.value and not r.partial:
                latest.pop(r.step, None)
                latest[r.step] = r
        self.results = list(latest.values())
        self.show_runs()
        if self.results:
            self.status.value = (f"{len(self.results)} earlier runs of <b>{self.model.value}</b> from "
                                 f"{self.store.path.name}; press Run to add one")
        else:
            self.status.value = f"no runs of <b>{self.model.value}</b> in {self.store.path.name} yet"
        return self.results

    def show_runs(self) -> None:
        """Draw the throughput of the runs in `results` against batch size (labelled empty axes when none)."""
        if self.results:
            self.show(plots.throughput_vs_batch(self.results))
        else:
            self.show(empty_figure("Throughput vs batch size", "batch size (sequences decoding together)",
                                   "output throughput (tok/s)", "no runs yet: choose the settings and press Run"))

    # handlers: one call each
    def run_clicked(self, _button: Any) -> Result | None:
        try:
            return self.run()
        except KeyboardInterrupt:  # a button has no cell to stop: the panel already says what happened
            return None

    def mode_changed(self, change: dict) -> None:
        self._apply(change["new"], self.override.value)

    def override_changed(self, change: dict) -> None:
        self._apply(self.mode.value, change["new"])

    def _apply(self, mode: str, fixed_length: bool) -> None:
        """Show only the controls that apply: no batch size for naive generate, no length unless it is fixed."""
        self.batch_size.disabled = mode == "naive"
        self.batch_size.layout.display = HIDDEN if mode == "naive" else SHOWN
        self.max_new_tokens.disabled = not fixed_length
        self.max_new_tokens.layout.display = SHOWN if fixed_length else HIDDEN

    def settings(self) -> dict[str, Any]:
        """The run the controls describe (naive generate always runs batch 1)."""
        return {"model": self.model.value, "workload": self.workload.value, "requests": self.requests.value,
                "mode": self.mode.value, "batch_size": 1 if self.mode.value == "naive" else self.batch_size.value,
                "max_new_tokens": self.max_new_tokens.value if self.override.value else None}

    def run(self, **overrides: Any) -> Result | None:
        """One benchmark run with the controls' settings (keys of `settings()` override them).

        Returns the Result, or None when the run could not be made; the reason is shown
        in the panel and kept in `last_error`. Kernel → Interrupt is shown there too, then re-raised
        (a cell stops; the Run button's handler ends quietly).
        """
        s = self.settings() | overrides
        self.errors.outputs = ()  # not clear_output(): that clears the page's copy, not the kernel's
        self.message.value = ""
        self.last_error = None
        self.run_button.disabled = True
        engine: HFEngine | None = None
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
        except KeyboardInterrupt as e:  # bench.run closed the engine and says what it kept (RunInterrupted)
            for key in [k for k, v in self._engines.items() if v is engine]:
                del self._engines[key]
            said = str(e) or "Interrupted before the run started: nothing was run or stored."
            kept = getattr(e, "kept", None) is not None
            self._fail(said + (" This chart leaves partial runs out." if kept else ""), status="interrupted")
            self.show_runs()
            raise
        except Exception as e:  # a handler's exception is otherwise lost in the browser console
            return self._fail(f"The run failed: {type(e).__name__}: {e}", traceback.format_exc())
        finally:
            self.run_button.disabled = False
        self.results.append(result)
        self.status.value = self._summary(result)
        self.show(plots.throughput_vs_batch(self.results))
        return result

    def record_finished(self, rec: RequestRecord) -> None:
        """on_record for bench.run: add one finished request to the live figure (redrawn at most 4 times a second)."""
        ttft, e2e = self.figure.data[0], self.figure.data[1]
        n = len(e2e.x or ()) + 1
        ttft.x, ttft.y = (*(ttft.x or ()), n), (*(ttft.y or ()), rec.ttft)
        e2e.x, e2e.y = (*(e2e.x or ()), n), (*(e2e.y or ()), rec.e2e)
        self.figure.layout.title.text = self._live_title(n)
        self.status.value = f"running <b>{self._running}</b>: {n}/{self._total} requests finished"
        self.area.show(force=n >= self._total)

    def show(self, fig: go.Figure) -> None:
        """Make fig what the panel's figure shows (the whole figure goes to the browser)."""
        self.area.show(fig)

    def display(self) -> widgets.VBox:
        """The panel; as the last line of a cell it shows itself."""
        return self.widget

    def _ipython_display_(self) -> None:
        from IPython.display import display  # deferred: IPython

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
        for name, mode in (("time to first token", "markers"), ("end-to-end latency", "lines+markers")):
            live.add_scatter(x=[], y=[], mode=mode, name=name, line={"color": colour(name)},
                             hovertemplate="request %{x}: %{y:.2f} s<extra></extra>")
        live.update_xaxes(title_text="requests finished (count)", rangemode="tozero")
        live.update_yaxes(title_text="time since the run started (s)", rangemode="tozero")
        finish(live, f"{step}: 0/{total} requests finished", live_label())
        self.show(live)

    def _live_title(self, n: int) -> str:
        return f"{self._running}: {n}/{self._total} requests finished<br><sup>{live_label()}</sup>"

    def _fail(self, message: str, details: str | None = None, status: str = "not run") -> None:  # None for run()
        """Say on the panel why the run did not happen (the message under the Run button, a traceback below it)."""
        self.last_error = message
        self.status.value = f"<b style='color:#c00'>{status}</b>"
        self.message.value = f"<div style='color:#c00;white-space:pre-wrap'>{html.escape(message)}</div>"
        if details:
            self.errors.append_stderr(details)
        return None

    @staticmethod
    def _summary(r: Result) -> str:
        s = r.summary
        ttft = s["ttft_s"]["p50"]
        return (f"<b>{r.label}</b>: {s['output_tok_s']:.1f} output tok/s over {s['requests']} requests, "
                f"TTFT p50 {ttft * 1e3:.0f} ms" if ttft is not None else f"<b>{r.label}</b> done")

