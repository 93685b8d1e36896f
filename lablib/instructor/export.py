"""An executed lab as one HTML file that works offline: every plotly figure drawn, plotly.js in it once, panels as snapshots.

Figures. `labs/bootstrap.py` sets plotly's renderer to `plotly_mimetype+notebook`, so each figure's output
carries a `text/html` div beside the plotly mimetype, and its own output (the first cell's) carries
plotly.js itself, inline. nbconvert keeps the divs. Here a page without figures sheds plotly.js (4.8 MB),
and a page with several copies (a notebook run without bootstrap) keeps one (`plotlyjs_once`).

Widgets. nbclient (and papermill) store the kernel's widget state in the notebook's metadata, and
nbconvert's page would draw the panels from it with `@jupyter-widgets/html-manager` fetched from unpkg:
offline the panels come out empty, and the state of plotly's FigureWidget carries its own copy of plotly.js
(5 MB). So each widget output is replaced by a static snapshot drawn here from that stored state (the
controls and their values, HTML and labels as they were, a FigureWidget as a plain plotly figure, an Output
area's outputs), marked as a snapshot, and the state is dropped. A panel is interactive only in a kernel.
"""
from __future__ import annotations

import copy
import html
import json
from typing import Any

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLYJS_MARK = "* plotly.js v"  # the first line of plotly.js's own header comment, once per copy
SNAPSHOT = ('<div class="lablib-widget-snapshot" style="border:1px dashed #999;padding:6px;margin:4px 0">'
            '<div style="font-size:85%;color:#666">Snapshot of an interactive panel as the kernel left it '
            '(run the notebook in JupyterLab to use it)</div>{body}</div>')
BOXES = {"HBoxModel": "row", "VBoxModel": "column", "BoxModel": "column", "GridBoxModel": "row",
         "AccordionModel": "column", "TabModel": "column", "StackModel": "column"}


def _value(s: dict[str, Any]) -> str:
    if "_options_labels" in s:
        labels, index = s["_options_labels"], s.get("index")
        picked = [labels[i] for i in (index if isinstance(index, list) else [index]) if i is not None]
        return ", ".join(picked) or "(none)"
    value = s.get("value")
    if isinstance(value, list):
        return " to ".join(str(v) for v in value)
    return "" if value is None else str(value)


def _outputs(outputs: list[dict[str, Any]]) -> str:
    """An Output widget's outputs (or a cell's), the richest plain form of each."""
    parts = []
    for out in outputs:
        data = out.get("data", {})
        if "text/html" in data:
            parts.append("".join(data["text/html"]))
        elif "image/png" in data:
            parts.append(f'<img src="data:image/png;base64,{data["image/png"]}">')
        elif out.get("output_type") == "stream" or "text/plain" in data:
            text = out.get("text") if out.get("output_type") == "stream" else data["text/plain"]
            parts.append(f"<pre>{html.escape(''.join(text))}</pre>")
    return "".join(parts)


def _figure(s: dict[str, Any]) -> str:
    import plotly.io as pio  # deferred: plotly

    data, layout = s.get("_widget_data") or [], s.get("_widget_layout") or {}
    if isinstance(data, str):
        data, layout = json.loads(data), json.loads(layout)
    return pio.to_html({"data": data, "layout": layout}, include_plotlyjs=False, full_html=False,
                       include_mathjax=False, default_width="100%", validate=False)


def snapshot(state: dict[str, Any], model_id: str, depth: int = 0) -> str:
    """Static HTML for the widget `model_id` (and its children) from a notebook's stored widget state."""
    model = state.get(model_id)
    if model is None or depth > 20:
        return "<em>(this widget was not saved with the notebook)</em>"
    s, name = model.get("state", {}), model.get("model_name", "")
    desc = html.escape(s.get("description") or "")
    if name in BOXES:
        kids = "".join(snapshot(state, ref.removeprefix("IPY_MODEL_"), depth + 1) for ref in s.get("children", []))
        return f'<div style="display:flex;flex-direction:{BOXES[name]};gap:8px;flex-wrap:wrap">{kids}</div>'
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<div>{desc} {s.get('value', '')}</div>"
    if name == "OutputModel":
        return f"<div>{_outputs(s.get('outputs', []))}</div>"
    if name in ("FloatProgressModel", "IntProgressModel"):
        return f'<div>{desc} <progress value="{s.get("value", 0)}" max="{s.get("max", 100)}"></progress></div>'
    if name == "ButtonModel":
        return f"<button disabled>{desc or html.escape(s.get('icon', ''))}</button>"
    if name == "AnyModel" and str(s.get("_anywidget_id", "")).endswith("FigureWidget"):
        return _figure(s)
    if "value" in s or "_options_labels" in s:
        return f"<div>{desc + ': ' if desc else ''}<b>{html.escape(_value(s))}</b></div>"
    return f"<div><code>[{html.escape(name or 'widget')}]</code></div>"


def static_widgets(nb: Any) -> int:
    """Replace every widget output in `nb` by its snapshot and drop the stored widget state; returns how many."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    count = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                continue
            out["data"] = {"text/html": SNAPSHOT.format(body=snapshot(state, view.get("model_id", ""))),
                           "text/plain": out["data"].get("text/plain", "")}
            count += 1
    nb.metadata.pop("widgets", None)
    return count


def _html_outputs(nb: Any) -> list[dict[str, Any]]:
    return [out for cell in nb.cells for out in cell.get("outputs", []) if "text/html" in out.get("data", {})]


def plotlyjs_once(nb: Any) -> None:
    """plotly.js in the page once, before the first figure; none in a page without figures.

    bootstrap's copy is in the first cell's output, before every figure the kernel drew. A notebook run
    without bootstrap may have none before a widget snapshot's figure, or several (plotly's renderer
    named explicitly): those are replaced by one copy at the first figure.
    """
    from plotly.offline import get_plotlyjs  # deferred: plotly

    outs = _html_outputs(nb)
    text = ["".join(out["data"]["text/html"]) for out in outs]
    copies = [i for i, t in enumerate(text) if PLOTLYJS_MARK in t]
    first_fig = next((i for i, t in enumerate(text) if "plotly-graph-div" in t), None)
    if first_fig is not None and len(copies) == 1 and copies[0] < first_fig:
        return
    for i in copies:
        outs[i]["data"]["text/html"] = ""
    if first_fig is not None:
        outs[first_fig]["data"]["text/html"] = f"<script>{get_plotlyjs()}</script>" + text[first_fig]


def to_html(nb: Any) -> str:
    """The executed notebook `nb` (not modified) as one offline HTML page (nbconvert's lab template)."""
    from nbconvert import HTMLExporter  # deferred: nbconvert

    nb = copy.deepcopy(nb)
    static_widgets(nb)
    plotlyjs_once(nb)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return body


def figure_count(nb: Any) -> int:
    """How many plotly figures the kernel drew in `nb` (outputs carrying plotly's mimetype)."""
    return sum(PLOTLY_MIME in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))
