"""The journey's figures: the whole road (one bar per rung, live and recorded side by side) and the
per-step throughput/TTFT pair.

`whole_road` is the report's first picture. Its rungs span decades (a 4.7M-parameter model on
two CPU cores next to an 8B model on an H200), so the throughput axis is logarithmic: equal
steps along the axis are equal factors. Every bar says where it was measured: live on this machine
(its CPU or GPU) or recorded on the H200 with the date, and which model and workload it ran,
because bars of different models are a road, not a like-for-like race.
"""
from __future__ import annotations

import math
import re

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..results.record import Result
from .style import (PAGE_PX, colour, finish, is_synthetic, provenance, require_results, series_name, step_labels,
                    trace_name)


def where(r: Result) -> str:
    """Where a run was measured, as its bar is labelled: "live on this machine (CPU: AMD EPYC, 2 cores)",
    "live on this machine (GPU: NVIDIA H200)" or "recorded on NVIDIA H200, 2026-11-29"."""
    if r.provenance == "recorded":
        return series_name(r, "").strip(" ()")
    hw = r.hardware
    if hw.get("gpu"):
        return f"live on this machine (GPU: {hw['gpu']})"
    cores = hw.get("cpu_cores_logical")
    return f"live on this machine (CPU: {hw.get('cpu') or 'unknown'}{f', {cores} cores' if cores else ''})"


def model_name(r: Result) -> str:
    """The model as a person reads it: "embedded, 4.7M params", "llama-3.1-8b (synthetic)"."""
    name = str(r.model.get("name") or "unknown model")
    if name.startswith("synthetic:"):
        name = name.split(":", 1)[1] + " (synthetic)"
    params = r.model.get("parameters")
    if params:
        name += f", {params / 1e9:.1f}B params" if params >= 1e9 else f", {params / 1e6:.1f}M params"
    return name


def tok_s_text(v: float) -> str:
    """Throughput as printed on a bar: 2,484 or 18.3."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


ROW_PX = 46  # height of one rung's row: its three-line tick label with room above and below


def _ticks(results: list[Result]) -> list[str]:
    ticks, seen = [], set()
    for r in results:
        wl = r.workload.get("name")
        on = f"{r.summary['requests']} requests" + (f" of {wl}" if wl and wl != "journey" else "")  # a rung's own set
        base = f"{r.step}<br><span style='font-size:10px'>{model_name(r)}<br>{on}</span>"
        tick, n = base, 1
        while tick in seen:
            n += 1
            tick = f"{base} #{n}"
        seen.add(tick)
        ticks.append(tick)
    return ticks


def whole_road(results: list[Result]) -> go.Figure:
    """Output tok/s per rung, in the order given (`experiments.journey.road`) from top to bottom, on a log axis.

    Horizontal bars: a rung's name, model and request count are its tick label (three lines, read across, never
    turned on their side or cut), and the figure grows a row per rung. One bar per rung in the rung's own colour
    (`style.colour`, the same in every figure); recorded bars are hatched. The legend, under the plot, names each
    place the bars were measured once ("live on this machine (CPU: ...)", "recorded on NVIDIA H200, <date>"), solid
    or hatched like its bars, and clicking it shows or hides them; every bar's hover repeats its place.
    """
    results = require_results(results, "whole_road")
    ticks, mixed = _ticks(results), len({r.provenance for r in results}) > 1
    fig = go.Figure()
    places: dict[str, bool] = {}  # where -> recorded, in the order drawn
    for i, r in enumerate(results):
        x, place = r.summary["output_tok_s"], where(r)
        places.setdefault(place, r.provenance == "recorded")
        fig.add_bar(y=[ticks[i]], x=[x], orientation="h", name=trace_name(r, mixed=mixed), legendgroup=place,
                    showlegend=False, text=[tok_s_text(x)], textposition="outside", cliponaxis=False,
                    hovertemplate=f"{r.step}: %{{x:,.1f}} output tok/s<br>{model_name(r)}, "
                                  f"{r.workload.get('name', '?')} workload, {r.summary['requests']} requests"
                                  f"<br>{place}<extra></extra>",
                    marker={"color": colour(r.step), "pattern": {"shape": "/" if r.provenance == "recorded" else ""}})
    for place, recorded in places.items():  # the legend: each place once, not each rung (its tick label names it)
        fig.add_bar(y=[None], x=[None], orientation="h", name=place, legendgroup=place, hoverinfo="skip",
                    marker={"color": PLACE_COLOUR, "pattern": {"shape": "/" if recorded else ""}})
    positive = [r.summary["output_tok_s"] for r in results if r.summary["output_tok_s"] > 0]
    lo, hi = (math.log10(min(positive)), math.log10(max(positive))) if positive else (0.0, 1.0)
    fig.update_yaxes(categoryorder="array", categoryarray=ticks, autorange="reversed",  # the first rung on top
                     title_text="rung of the journey, in order (top to bottom)")
    fig.update_xaxes(type="log", range=[math.floor(lo) - 0.1, hi + 0.45],  # room for the last bar's number
                     title_text="output throughput (tok/s, log scale)")
    fig.update_layout(barmode="overlay", legend={"groupclick": "togglegroup"})
    finish(fig, "The whole road: output tokens per second at each rung (higher is better)",
           provenance(results), synthetic=any(is_synthetic(r) for r in results), legend_below=True,
           legend_width=bars_width(ticks))
    fig.update_layout(legend={"xref": "container"},
                      height=fig.layout.margin.t + fig.layout.margin.b + ROW_PX * len(results) + 40)
    return fig


PLACE_COLOUR = "#9e9e9e"  # a place's legend swatch: neutral, since every rung has its own colour


def bars_width(ticks: list[str]) -> int:
    """About how wide the bars' area is: the page less the right margin and the widest tick label (12 px rung name,
    10 px lines under it). A horizontal legend wraps at this width, not the page's."""
    widest = max(max(7 * len(lines[0]), 6 * max(map(len, lines[1:]), default=0))
                 for lines in (re.sub(r"<(?!br>)[^>]+>", "", t).split("<br>") for t in ticks))
    return PAGE_PX - 80 - widest - 10


def journey(results: list[Result]) -> go.Figure:
    """Output tok/s per step on top, TTFT p50 and p99 (ms) below, steps in the given order."""
    results = require_results(results, "journey")
    labels = step_labels(results)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("output throughput (higher is better)",
                                        "time to first token (lower is better)"))
    fig.add_bar(x=labels, y=[r.summary["output_tok_s"] for r in results], name="output tok/s",
                marker_color=[colour(r.step) for r in results],
                text=[tok_s_text(r.summary["output_tok_s"]) for r in results],
                textposition="outside", cliponaxis=False, row=1, col=1)
    for q in ("p50", "p99"):
        ys = [None if r.summary["ttft_s"][q] is None else r.summary["ttft_s"][q] * 1e3 for r in results]
        fig.add_bar(x=labels, y=ys, name=f"TTFT {q} (ms)", marker_color=colour("TTFT"),
                    opacity=1.0 if q == "p50" else 0.5, row=2, col=1)
    fig.update_yaxes(title_text="output throughput (tok/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="TTFT (ms)", rangemode="tozero", row=2, col=1)
    fig.update_layout(barmode="group")
    return finish(fig, "The journey: each optimisation step", provenance(results),
                  synthetic=any(is_synthetic(r) for r in results), height=650)
