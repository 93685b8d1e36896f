"""Lab 10's panel: describe a deployment with the controls, read the advisor's settings and what each rests on.

Every change builds one `experiments.advisor.Goal` from the controls and shows `plan(goal)`'s rows as a table (knob,
setting, why, evidence, source) with the settings as the `VLLMConfig(...)` to paste. A goal the advisor refuses
(a shared prefix longer than the prompt, a model that fits no GPUs allowed) shows its message in place of the
table, in lablib's one message shape, rather than raising inside a widget callback.
"""
from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from ..experiments.advisor.latency import GPUS, SCHEMES
from ..experiments.advisor.plan import MAX_GPUS, Goal, config_text, plan
from ..models import architectures

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
COLUMNS = ("knob", "setting", "why", "evidence", "source")


def view(goal: dict[str, Any]) -> dict[str, Any]:
    """What the panel shows for these Goal fields: {"rows", "config" (its text), "html"}, or {"error", "html"}."""
    try:
        g = Goal(**goal)
        advice = plan(g)
    except ValueError as e:
        return {"error": str(e), "html": f"<p style='color:#b00020'>{html.escape(str(e))}</p>"}
    rows = advice["rows"]
    cells = "".join("<tr>" + "".join(f"<td style='padding:2px 6px;vertical-align:top'>{html.escape(str(r[c]))}</td>"
                                     for c in COLUMNS) + "</tr>" for r in rows)
    head = "".join(f"<th style='text-align:left;padding:2px 6px'>{c}</th>" for c in COLUMNS)
    config = config_text(g, advice)
    return {"rows": rows, "config": config,
            "html": f"<table>{head}{cells}</table><p><code>{html.escape(config)}</code></p>"}


class AdvisorPanel:
    """The goal's fields as controls; the advice redrawn on every change."""

    def __init__(self, **goal: Any):
        start = Goal(**goal)  # a bad starting goal is refused here, before any widget is drawn
        style = {"continuous_update": False, "style": {"description_width": "initial"}}
        self.model = widgets.Dropdown(options=tuple(architectures()), value=start.model, description="model")
        self.gpu = widgets.Dropdown(options=tuple(GPUS), value=start.gpu, description="GPU")
        self.precision = widgets.Dropdown(options=SCHEMES, value=start.lowest_precision,
                                          description="lowest precision")
        self.concurrency = widgets.SelectionSlider(options=sorted({*CONCURRENCY, start.concurrency}),
                                                   value=start.concurrency, description="requests in flight", **style)
        self.prompt = widgets.SelectionSlider(options=sorted({*LENGTHS, start.prompt_tokens}),
                                              value=start.prompt_tokens, description="prompt tokens", **style)
        self.output = widgets.SelectionSlider(options=sorted({*LENGTHS, start.output_tokens}),
                                              value=start.output_tokens, description="output tokens", **style)
        self.shared = widgets.IntText(value=start.shared_prefix_tokens, description="shared prefix tokens", **style)
        self.slo = widgets.FloatText(value=start.tpot_slo_ms or 0.0, description="TPOT SLO ms (0: none)", **style)
        self.gpus = widgets.IntSlider(value=start.max_gpus, min=1, max=MAX_GPUS, description="max GPUs", **style)
        self.table = widgets.HTML()
        controls = (self.model, self.gpu, self.precision, self.concurrency, self.prompt, self.output, self.shared,
                    self.slo, self.gpus)
        for w in controls:
            w.observe(lambda change: self.refresh(), names="value")
        self.widget = widgets.VBox([widgets.HBox(controls[:3]), widgets.HBox(controls[3:6]),
                                    widgets.HBox(controls[6:]), self.table])
        self.refresh()

    def goal(self) -> dict[str, Any]:
        """The controls' values, as Goal's fields."""
        return {"model": self.model.value, "gpu": self.gpu.value, "lowest_precision": self.precision.value,
                "concurrency": self.concurrency.value, "prompt_tokens": self.prompt.value,
                "output_tokens": self.output.value, "shared_prefix_tokens": self.shared.value,
                "tpot_slo_ms": self.slo.value or None, "max_gpus": self.gpus.value}

    def refresh(self) -> dict[str, Any]:
        """Advise on the controls' goal and show it."""
        self.view = view(self.goal())
        self.table.value = self.view["html"]
        return self.view

    def display(self) -> widgets.VBox:
        """The panel; as the last line of a cell it shows itself."""
        return self.widget
