"""A panel's figure that survives a browser refresh: a static plotly figure in an `ipywidgets.Output`.

A plotly `FigureWidget` is a custom widget (anywidget) whose front-end model is rebuilt from its
JavaScript on every page load; after a browser refresh JupyterLab cannot rebuild it ("[anywidget]
Failed to initialize model") and the figure stays empty while the kernel keeps updating it. An
`Output` widget is one of ipywidgets' own models: its state, the list of outputs it holds, lives in
the kernel and is sent again to a reloaded page, where the figure is drawn by the ordinary plotly
renderer from the figure's JSON, as any cell output is. So a panel keeps a plain `go.Figure` and,
on every change, replaces the Output's one output with that figure, whole. It costs a redraw per
change (a few kB of JSON), which `min_interval_s` throttles for fast streams.

The output is written as a display_data message straight into `Output.outputs` (not with
`with output:`), so it works from a button's handler, from a background thread (the VRAM sampler)
and in a test with no kernel, where `outputs` can be read back.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def mime_bundle(fig: go.Figure) -> dict[str, Any]:
    """The figure as a cell would show it (plotly's default renderer), always with plotly's own JSON mimetype."""
    bundle: dict[str, Any] = {}
    if pio.renderers.default:  # JupyterLab: plotly's mimetype; Colab: HTML that loads plotly.js; VS Code its own
        try:
            bundle = dict(fig._repr_mimebundle_() or {})
        except Exception:  # a renderer that needs what is missing (an image renderer without kaleido)
            bundle = {}
    if PLOTLY_MIME not in bundle:
        bundle.update(pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict()))
    title = fig.layout.title.text or "figure"
    bundle.setdefault("text/plain", f"<plotly figure: {title.split('<br>')[0]}>")
    return bundle


class FigureArea:
    """A plain figure shown in an Output widget, redrawn whole by `show` (at most every `min_interval_s`)."""

    def __init__(self, figure: go.Figure | None = None, min_interval_s: float = 0.0, height: str | None = None):
        self.output = widgets.Output(layout=widgets.Layout(min_height=height or "0px"))
        self.figure = figure if figure is not None else go.Figure()
        self.min_interval_s = min_interval_s
        self.renders = 0
        self._last = 0.0
        self._lock = threading.Lock()
        self.show(self.figure)

    def show(self, fig: go.Figure | None = None, force: bool = True) -> bool:
        """Make `fig` (default: the current figure, changed in place) what the area shows; False when throttled."""
        with self._lock:
            if fig is not None:
                self.figure = fig
            now = time.monotonic()
            if not force and now - self._last < self.min_interval_s:
                return False
            self._last = now
            self.output.outputs = ({"output_type": "display_data", "data": mime_bundle(self.figure), "metadata": {}},)
            self.renders += 1
            return True

    def due(self) -> bool:
        """Whether a throttled `show` would draw now (so a caller can skip building a figure that would wait)."""
        return time.monotonic() - self._last >= self.min_interval_s

    def shown(self) -> dict[str, Any]:
        """The plotly JSON the area shows now ({"data": [...], "layout": {...}}), as the browser receives it."""
        outputs = self.output.outputs
        return outputs[-1]["data"][PLOTLY_MIME] if outputs else {}


class Explorer:
    """A panel of controls over one plain-data view, drawn into a FigureArea with a text card and captions.

    A subclass sets `self.text`, `self.caption` (HTML widgets), `self.area` (a FigureArea) and `self.widget` (the
    whole panel), observes each control with `value_changed`, and gives `settings()` (the controls' values),
    `compute(settings)` (the view: a dict with "text" and "captions") and `draw(view)` (its figure). Everything
    shown is in the view, so a test reads the view without a browser."""

    view: dict[str, Any]

    def settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def compute(self, settings: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def draw(self, view: dict[str, Any]) -> go.Figure:
        raise NotImplementedError

    def value_changed(self, change: dict) -> None:
        self.refresh()

    def refresh(self) -> dict[str, Any]:
        """Recompute from the controls and redraw the text, the figure and the captions."""
        self.view = self.compute(self.settings())
        self.show(self.view)
        return self.view

    def show(self, view: dict[str, Any]) -> None:
        self.text.value = view["text"]
        self.caption.value = "".join(f"<p style='margin:2px 0;color:#555'>{line}</p>" for line in view["captions"])
        self.area.show(self.draw(view))

    def display(self) -> widgets.VBox:
        """The explorer; as the last line of a cell it shows itself."""
        return self.widget

    def _ipython_display_(self) -> None:
        from IPython.display import display  # deferred: IPython

        display(self.widget)
