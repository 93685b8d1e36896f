"""The journey figure: one bar per optimisation step, throughput on top and TTFT below."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..results.record import Result
from .style import _recorded_note, _require, _unique_labels


def journey(results: list[Result]) -> go.Figure:
    """The whole road: output tok/s per step on top, TTFT p50 and p99 (ms) below, steps in the given order."""
    results = _require(results, "journey")
    labels = _unique_labels(results)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("output throughput (higher is better)", "time to first token (lower is better)"))
    fig.add_bar(x=labels, y=[r.summary["output_tok_s"] for r in results], name="output tok/s",
                marker_color="#00cc96", text=[f"{r.summary['output_tok_s']:.0f}" for r in results],
                textposition="outside", row=1, col=1)
    for q, colour in (("p50", "#636efa"), ("p99", "#ab63fa")):
        ys = [None if r.summary["ttft_s"][q] is None else r.summary["ttft_s"][q] * 1e3 for r in results]
        fig.add_bar(x=labels, y=ys, name=f"TTFT {q} (ms)", marker_color=colour, row=2, col=1)
    fig.update_yaxes(title_text="tok/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=2, col=1)
    fig.update_layout(title="The journey: each optimisation step" + _recorded_note(results),
                      barmode="group", height=650)
    return fig
