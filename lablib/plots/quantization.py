"""Lab 06's pictures: what each quantization scheme stores, what it costs in quality, what it buys in speed.

- `storage_figure`: each checkpoint's bytes, split into the decoder's Linear layers (the part a scheme
  quantizes, labelled with its bits per weight), lm_head, and the embedding and norms that stay 16-bit.
- `quality_figure`: perplexity change against bf16 with the user's gate drawn in, greedy agreement, and how
  many tokens the greedy text stays the same before it first differs.
- `speed_figure`: decode tok/s against batch size per scheme (log-log), each against its own bandwidth
  roofline (dashed): bytes per weight set the ceiling while decode is memory-bound; once batched, the GEMM
  turns compute-bound and int4's dequantization is no longer free.
- `summary_figure`: the lab's last picture, the three side by side: speed by batch, weights against bf16,
  quality per scheme.

Every scheme has one colour in all four (`scheme_colour`). Provenance is said once per figure: quality and
checkpoint sizes are measured live on this CPU on the embedded model; speed and GPU memory come from vLLM on the
H200 (live there, recorded elsewhere, or "not recorded yet" with the step that records them).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import DEFAULT_HEIGHT, colour, finish

SCHEME_COLOURS = {  # one colour per scheme, in every figure of the lab
    "bf16": "#7f7f7f",  # the reference: grey, as hf-naive is the journey's
    "fp8": "#ff7f0e", "fp8-dynamic": "#d62728", "w8a8-int8": "#9467bd",
    "gptq-w4a16": "#1f77b4", "awq-w4a16": "#2ca02c", "bf16-kv-fp8": "#17becf",
}
MB = 1e6
PARTS = (("decoder Linear layers", "linear_bytes"), ("lm_head", "lm_head_bytes"),
         ("embedding and norms (16-bit)", "rest_bytes"))
PART_COLOURS = {"decoder Linear layers": "#1f77b4", "lm_head": "#ff7f0e", "embedding and norms (16-bit)": "#7f7f7f"}
CPU_WHERE = "live on this CPU (embedded model)"
# a value over a narrow grouped bar: read upright, at full size (plotly would shrink it to the bar's width)
UPRIGHT_LABELS = {"textangle": -90, "constraintext": "none", "textfont": {"size": 11}}
ROOFLINE_NOTE = "dotted: each scheme's bandwidth roofline (its weight bytes and KV cache read once per step)"


def scheme_colour(name: str) -> str:
    """A scheme's colour (SCHEME_COLOURS; another name, e.g. 'gptq-w4a16+lm_head', takes its base scheme's)."""
    base = name.split("+")[0]
    return SCHEME_COLOURS.get(name) or SCHEME_COLOURS.get(base) or colour(name)


def _schemes(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [str(r["scheme"]) for r in rows]


def storage_figure(rows: Sequence[dict[str, Any]]) -> go.Figure:
    """Stacked MB per checkpoint (experiments.quantization.storage_rows): what is quantized and what stays 16-bit."""
    if not rows:
        raise ValueError("storage_figure: no rows. Fix: pass experiments.quantization.storage_rows(SCHEMES, WORK).")
    fig = go.Figure()
    x = _schemes(rows)
    for name, key in PARTS:
        if not any(r[key] for r in rows):
            continue
        text = [f"{r['bits_per_weight']:.2f} bits/weight" if key == "linear_bytes" and r["bits_per_weight"] else ""
                for r in rows]
        fig.add_bar(x=x, y=[r[key] / MB for r in rows], name=name, marker_color=PART_COLOURS[name], text=text,
                    textposition="inside", hovertemplate="%{x}: %{y:.2f} MB " + name + "<extra></extra>")
    fig.add_scatter(x=x, y=[r["file_bytes"] / MB for r in rows], mode="text", name="file size",
                    text=[f"{r['file_bytes'] / MB:.2f} MB (x{r['vs_bf16']:.2f})" for r in rows],
                    textposition="top center", showlegend=False, cliponaxis=False, hoverinfo="skip",
                    textfont={"color": "#444"})
    top = max(r["file_bytes"] for r in rows) / MB
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="bytes stored (MB)", range=[0, top * 1.2])
    fig.update_xaxes(title_text="scheme")
    return finish(fig, "What each checkpoint stores", CPU_WHERE + ": the checkpoints written here, read from "
                  "their safetensors headers", legend_below=True)


def quality_figure(rows: Sequence[dict[str, Any]], max_increase_pct: float) -> go.Figure:
    """Perplexity change (with the gate), greedy agreement and mean first divergence per scheme, against bf16."""
    run = [r for r in rows if r["scheme"] != "bf16"]
    if not run:
        raise ValueError("quality_figure: no quantized scheme in the rows. Fix: pass quality_table(SCHEMES, ...).")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.1,
                        subplot_titles=("perplexity vs bf16", "greedy tokens as bf16's", "tokens until the first difference"))
    fig.update_annotations(font_size=13)
    for r in run:
        name = str(r["scheme"])
        for col, y, fmt in ((1, r["ppl_change_pct"], f"{r['ppl_change_pct']:+.2f}%"),
                            (2, 100 * r["agreement"], f"{r['agreement']:.0%}"),
                            (3, r["mean_first_divergence"], f"{r['mean_first_divergence']:.1f}")):
            fig.add_bar(x=[name], y=[y], name=name, legendgroup=name, showlegend=col == 1,
                        marker_color=scheme_colour(name), text=[fmt], textposition="outside", cliponaxis=False,
                        row=1, col=col)
    fig.add_hline(y=max_increase_pct, line_dash="dash", line_color="#d62728", row=1, col=1,
                  annotation_text=f"your gate: +{max_increase_pct:g}%", annotation_position="top left")
    pcts = [r["ppl_change_pct"] for r in run] + [max_increase_pct, 0.0]
    fig.update_yaxes(title_text="perplexity change (%)", range=[min(pcts) - 0.5, max(pcts) * 1.3 + 0.2], row=1, col=1)
    fig.update_yaxes(title_text="same token as bf16 (%)", range=[0, 115], row=1, col=2)
    new = rows[0].get("greedy", "")
    fig.update_yaxes(title_text="mean first divergence (tokens)", rangemode="tozero", row=1, col=3)
    fig.update_xaxes(title_text="scheme")
    fig = finish(fig, "Quality per scheme, against the bf16 target", CPU_WHERE + f": {rows[0].get('eval', '')}",
                 notes=[f"greedy: {new}; a request that never differs counts its full length"] if new else (),
                 legend_below=True)
    return _room_for_subplot_titles(fig)


def _speed_traces(fig: go.Figure, rows: Sequence[dict[str, Any]], row: int | None = None, col: int | None = None,
                  legend: bool = True) -> None:
    where = {"row": row, "col": col} if row else {}
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        pts = sorted((r for r in rows if r["scheme"] == scheme), key=lambda r: r["batch"])
        c = scheme_colour(scheme)
        fig.add_scatter(x=[r["batch"] for r in pts], y=[r["decode_tok_s"] for r in pts], mode="lines+markers",
                        name=scheme, legendgroup=scheme, showlegend=legend, line={"color": c},
                        hovertemplate=scheme + ", batch %{x}: %{y:,.0f} decode tok/s<extra></extra>", **where)
        if any(r.get("roofline_tok_s") for r in pts):
            fig.add_scatter(x=[r["batch"] for r in pts], y=[r.get("roofline_tok_s") for r in pts], mode="lines",
                            name=f"{scheme} roofline", legendgroup=scheme, showlegend=legend,
                            line={"color": c, "dash": "dot", "width": 1},
                            hovertemplate=scheme + " bandwidth roofline, batch %{x}: %{y:,.0f} tok/s<extra></extra>",
                            **where)


def _empty_note(fig: go.Figure, row: int | None = None, col: int | None = None) -> None:
    """No speed rows: an invisible trace keeps the axes (and their titles) drawn, a note says why it is empty."""
    where = {"row": row, "col": col} if row else {}
    fig.add_scatter(x=[1, 256], y=[100, 10000], mode="markers", marker={"opacity": 0}, showlegend=False,
                    hoverinfo="skip", **where)
    ref = ("x domain", "y domain") if row else ("paper", "paper")
    fig.add_annotation(text="no speed runs to draw yet:<br>the line under the title says why", xref=ref[0],
                       yref=ref[1], x=0.5, y=0.5, showarrow=False, font={"size": 12, "color": "gray"})


def speed_figure(rows: Sequence[dict[str, Any]] | None, where: str) -> go.Figure:
    """Decode tok/s against batch size per scheme (speed rows), each with its bandwidth roofline; log-log.

    `where` is the Shown's label ("recorded on NVIDIA H200, ...", "live on ...", or why nothing is recorded yet);
    with no rows the figure says so instead of drawing anything.
    """
    fig = go.Figure()
    if rows:
        _speed_traces(fig, rows)
    else:
        _empty_note(fig)
    fig.update_xaxes(title_text="batch (concurrent requests)", type="log")
    fig.update_yaxes(title_text="decode throughput (tok/s)", type="log")
    return finish(fig, "Decode speed by batch size, per scheme (synthetic Llama-3.1-8B shape)", where,
                  synthetic=True, notes=[ROOFLINE_NOTE], legend_below=True)


def summary_figure(quality: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]],
                   speed: Sequence[dict[str, Any]] | None, speed_where: str, max_increase_pct: float) -> go.Figure:
    """The lab's last picture: speed by batch (GPU), weights against bf16 (both models), quality (CPU), side by side."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, column_widths=[0.4, 0.3, 0.3],
                        subplot_titles=("speed by batch (synthetic 8B)", "weights against bf16", "quality (embedded)"))
    fig.update_annotations(font_size=13)
    if speed:
        _speed_traces(fig, speed, 1, 1)
    else:
        _empty_note(fig, 1, 1)
    disk = [r for r in stored if r["scheme"] != "bf16"]
    fig.add_bar(x=_schemes(disk), y=[r["vs_bf16"] for r in disk], name="embedded model, on disk",
                marker_color="#8c564b", text=[f"x{r['vs_bf16']:.2f}" for r in disk], textposition="outside",
                cliponaxis=False, **UPRIGHT_LABELS, row=1, col=2)
    if speed:
        bf16 = next((r["weight_gib"] for r in speed if r["scheme"] == "bf16" and r.get("weight_gib")), None)
        gpu = {r["scheme"]: r["weight_gib"] / bf16 for r in speed if bf16 and r.get("weight_gib")
               and r["scheme"] not in ("bf16", "bf16-kv-fp8")}
        fig.add_bar(x=list(gpu), y=list(gpu.values()), name="synthetic 8B, in GPU memory", marker_color="#bcbd22",
                    text=[f"x{v:.2f}" for v in gpu.values()], textposition="outside", cliponaxis=False,
                    **UPRIGHT_LABELS, row=1, col=2)
    run = [r for r in quality if r["scheme"] != "bf16"]
    for r in run:
        name = str(r["scheme"])
        fig.add_bar(x=[name], y=[r["ppl_change_pct"]], name=name, legendgroup=name, showlegend=not speed,
                    marker_color=scheme_colour(name), text=[f"{r['ppl_change_pct']:+.2f}%"], textposition="outside",
                    cliponaxis=False, row=1, col=3)
    fig.add_hline(y=max_increase_pct, line_dash="dash", line_color="#d62728", row=1, col=3,
                  annotation_text=f"gate +{max_increase_pct:g}%", annotation_position="top left")
    pcts = [r["ppl_change_pct"] for r in run] + [max_increase_pct, 0.0]
    fig.update_xaxes(title_text="batch (requests)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="decode throughput (tok/s)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="weight bytes vs bf16 (x)", range=[0, 1.15], row=1, col=2)
    fig.update_yaxes(title_text="perplexity change (%)", range=[min(pcts) - 0.5, max(pcts) * 1.3 + 0.2], row=1, col=3)
    fig.update_xaxes(title_text="scheme", row=1, col=2)
    fig.update_xaxes(title_text="scheme", row=1, col=3)
    fig.update_layout(barmode="group")
    where = f"quality and the embedded model's sizes {CPU_WHERE.removesuffix(' (embedded model)')}; speed and GPU " \
            f"memory: {speed_where}"
    fig = finish(fig, "Memory, speed and quality per scheme", where, synthetic=True, height=520, legend_below=True)
    return _room_for_subplot_titles(fig)


def _room_for_subplot_titles(fig: go.Figure) -> go.Figure:
    """finish() sizes the top margin for the title's lines; subplot titles sit above the plots and need a line more,
    which the figure grows by (the plots keep the height finish gave them, and their axis titles still fit)."""
    fig.update_layout(margin={"t": fig.layout.margin.t + 24}, height=(fig.layout.height or DEFAULT_HEIGHT) + 24)
    return fig
