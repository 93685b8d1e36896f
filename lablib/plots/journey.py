"""The journey's figures: one model up the ladder per panel, and the per-step throughput/TTFT pair.

`ladder_figure` is the report's first picture: each panel is one model measured in one place (live here, or
recorded on the H200, with the dates), its rungs top to bottom, each bar labelled with its factor over the rung
before and over naive generate, and its MBU. Bars of different models, or of live and recorded runs, never share a
panel: a 4.7M model on two CPU cores beside an 8B on an H200 is a road, not a like-for-like race. Rungs span
decades, so every throughput axis is logarithmic: equal steps along it are equal factors.
"""
from __future__ import annotations

import math
import re
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..experiments import journey as jx
from ..results.record import Result
from .style import colour, finish, is_synthetic, provenance, require_results, series_name, step_labels


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


SIDE_ROAD = re.compile(r"-(draft|ngram|eagle)")  # speculative rungs: each against its baseline, off the road


def _before_of(runs: list[Result]) -> dict[str, str]:
    """Each rung's own baseline (`journey.ladder`'s Step.baseline for the batch sizes these runs named, a recording's
    RECORDED_BASELINE)."""
    steps = jx.ladder(jx.batch_sizes_of(runs))
    return {**{s.name: s.baseline for s in steps if s.baseline}, **jx.RECORDED_BASELINE}


def ladder_panels(results: list[Result], workload: str = "journey") -> list[dict[str, Any]]:
    """The road as one ladder per model and place: the runs of `workload` grouped by model and by live or recorded
    (never interleaved), in the road's order. Per run: tok/s, the factor over the rung before (its own baseline where
    it has one in the panel, else the nearest bar above that does not speculate: lab 08's rungs are side roads off
    their own baselines), over naive generate (the panel's hf-naive, where it has one), MBU
    (decode's share of the GPU's bandwidth; None where unknown: a CPU). Runs of other workloads are counted per panel, not drawn."""
    panels: dict[tuple[str, bool], dict[str, Any]] = {}
    for r in results:
        key = (str(r.model.get("name")), r.provenance == "recorded")
        p = panels.setdefault(key, {"model": key[0], "recorded": key[1], "runs": [], "other_workloads": []})
        (p["runs"] if r.workload.get("name") == workload else p["other_workloads"]).append(r)
    out = []
    for p in panels.values():
        if not p["runs"]:
            continue
        by_step = {r.step: r for r in p["runs"]}
        before_of = _before_of(p["runs"])  # the panel's own batch sizes name its rungs
        naive = by_step.get("hf-naive")
        rows = []
        for i, r in enumerate(p["runs"]):
            tok = r.summary["output_tok_s"]
            road = [q for q in p["runs"][:i] if not SIDE_ROAD.search(q.step)]  # the bars above, speculation left out
            base = by_step.get(before_of.get(r.step, "")) or (road[-1] if road else None)
            rows.append({"step": r.step, "tok_s": tok, "before": base.step if base else None,
                         "over_before": tok / base.summary["output_tok_s"] if base else None,
                         "over_naive": tok / naive.summary["output_tok_s"] if naive and r is not naive and base is not
                         naive else None,
                         "mbu": mbu if isinstance(mbu := (r.roofline or {}).get("mbu"), (int, float)) else None,
                         "requests": r.summary["requests"], "where": where(r),
                         "subset": r.config.get("subset"), "result": r,
                         "naive_subset": bool(naive and naive.config.get("subset") and not r.config.get("subset"))})
        out.append({**p, "rows": rows, "title": f"{model_name(p['runs'][0])}: {_places(p['runs'])}"})
    return out


def _places(runs: list[Result]) -> str:
    """Where a panel's runs were measured, each place once: "recorded on NVIDIA H200, 2026-11-29 and 2026-12-01"."""
    places = list(dict.fromkeys(where(r) for r in runs))
    heads = {p.rsplit(", ", 1)[0] for p in places}
    if len(places) > 1 and len(heads) == 1 and all(p.startswith("recorded on ") for p in places):
        return f"{heads.pop()}, {' and '.join(p.rsplit(', ', 1)[1] for p in places)}"
    return "; ".join(places)


def bar_text(row: dict[str, Any]) -> str:
    """A ladder bar's label: tok/s, x over the rung before (named), x over naive, MBU."""
    parts = [tok_s_text(row["tok_s"])]
    if row["over_before"] is not None:
        parts.append(f"x{row['over_before']:.2f} over {row['before']}")
    if row["over_naive"] is not None:
        parts.append(f"x{row['over_naive']:,.1f} over naive" + (" (its subset)" if row.get("naive_subset") else ""))
    if row["mbu"] is not None:
        parts.append(f"MBU {row['mbu']:.0%}" if row["mbu"] >= 0.01 else f"MBU {row['mbu']:.2%}")
    return " · ".join(parts)


def ladder_figure(results: list[Result]) -> go.Figure:
    """One model up the ladder per panel (`ladder_panels`): its journey rungs top to bottom on a log axis, each bar
    labelled with its factor over the rung before, over naive generate and its MBU; live and recorded runs, and
    different models, in panels of their own, so no bar is read against another model's."""
    results = require_results(results, "ladder_figure")
    panels = ladder_panels(results)
    if not panels:
        raise ValueError("ladder_figure: no run of the journey workload. Fix: run_journey, or pass its Results.")
    heights = [len(p["rows"]) for p in panels]
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=[p["title"] for p in panels],
                        row_heights=[h / sum(heights) for h in heights], vertical_spacing=0.32 / len(panels))
    for i, p in enumerate(panels, start=1):
        ys = [f"{row['step']}" + (" (subset)" if row["subset"] else "") for row in p["rows"]]
        fig.add_bar(y=ys, x=[row["tok_s"] for row in p["rows"]], orientation="h", showlegend=False,
                    text=[bar_text(row) for row in p["rows"]], textposition="outside", cliponaxis=False,
                    marker={"color": [colour(row["step"]) for row in p["rows"]],
                            "pattern": {"shape": "/" if p["recorded"] else ""}},
                    hovertext=[f"{row['step']}: {row['requests']} requests{', ' + row['subset'] if row['subset'] else ''}"
                               f"<br>{row['where']}" for row in p["rows"]], hoverinfo="text+x", row=i, col=1)
        values = [row["tok_s"] for row in p["rows"] if row["tok_s"] > 0]
        lo, hi = math.log10(min(values)), math.log10(max(values))
        fig.update_xaxes(type="log", range=[math.floor(lo) - 0.1, hi + 1.3], row=i, col=1,  # room for the labels
                         title_text="output tok/s (log scale)" if i == len(panels) else None)
        fig.update_yaxes(autorange="reversed", row=i, col=1)
    others = sum(len(p["other_workloads"]) for p in panels)
    notes = [f"{others} rung(s) on workloads of their own (prefix caching's shared prefix, the server's longer run) "
             "are not drawn: the side roads' table has them"] if others else []
    finish(fig, "One model up the ladder: each rung's factor over the one before and over naive generate",
           provenance(results), synthetic=any(is_synthetic(r) for r in results), notes=notes)
    fig.update_layout(height=fig.layout.margin.t + fig.layout.margin.b + ROW_PX * sum(heights) + 60 * len(panels))
    return fig
