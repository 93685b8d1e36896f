"""Tensor-parallel pictures: where one decode step's time goes under TP=t, what fits where, and TP=1 measured.

All but the last draw the cost model (`lablib.mechanisms.parallel`, swept by `lablib.experiments.parallel`; tp_scaling
adds measured points where it is given them), so their provenance line says "simulated ... a model, not a
measurement":

- `step_parts`: one decode step's time, stacked: weights and KV read from HBM, compute (drawn only where it,
  not memory, binds), the all-reduces' bandwidth and latency parts, the fixed overhead; per t, per batch.
- `tp_scaling`: per-token latency and throughput against t, one line per link, against the ideal t=1 / t, with
  vLLM's measured TP points on it where given (or a note that they are not measured).
- `communication_share`: the share of the step spent waiting on all-reduces against batch, per link and t,
  with the line above which communication dominates.
- `fit_heatmap`: model x scheme x GPU -> the smallest t that holds the weights and one long sequence.
- `two_gpus`: TP=2 vs PP=2 vs a second replica, throughput and latency, with the plans that do not fit.
- `tp1_figure`: vLLM's TP=1 runs (live, recorded, or "not recorded yet") on the cost model's t=1 line.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import colour, finish, ordered_colours, rows_provenance, time_axis

PARTS = (("weights_s", "weights"), ("kv_s", "KV cache"), ("compute_s", "compute"),
         ("allreduce_bandwidth_s", "all-reduce bandwidth"), ("allreduce_latency_s", "all-reduce latency"),
         ("overhead_s", "overhead"))
DOMINATES = 0.5  # the share of the step above which communication dominates
NOT_FIT = "open markers: does not fit in 90% of one GPU's memory at that t"


def _pick(rows: Sequence[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    got = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if not got:
        raise ValueError(f"no rows with {match}: pass lablib.experiments.parallel.cost_rows(...) that include them.")
    return got


def _t_axis(fig: go.Figure, tps: Sequence[int], **where: Any) -> None:
    fig.update_xaxes(type="log", tickvals=list(tps), ticktext=[str(t) for t in tps],
                     title_text="tensor-parallel size t (GPUs)", **where)


def _part(row: dict[str, Any], key: str) -> float:
    """A part as the step adds it up: memory (weights + KV) or compute, whichever binds, plus the rest."""
    memory_bound = row["weights_s"] + row["kv_s"] >= row["compute_s"]
    if key in ("weights_s", "kv_s"):
        return row[key] if memory_bound else 0.0
    if key == "compute_s":
        return 0.0 if memory_bound else row[key]
    return row[key]


def step_parts(rows: Sequence[dict[str, Any]], model: str, link: str = "NVLink 4",
               batches: Sequence[int] = (1, 64)) -> go.Figure:
    """Stacked parts of one decode step per t, one panel per batch, from cost_rows."""
    fig = make_subplots(rows=1, cols=len(batches), subplot_titles=[f"batch {b}" for b in batches],
                        horizontal_spacing=0.08)
    for col, b in enumerate(batches, 1):
        sel = sorted(_pick(rows, model=model, link=link, batch=b), key=lambda r: r["t"])
        unit, scale, _ = time_axis(r["latency_s"] for r in sel)
        x = [f"TP={r['t']}" for r in sel]
        for key, name in PARTS:
            y = [_part(r, key) * scale for r in sel]
            fig.add_bar(x=x, y=y, name=name, marker_color=colour(name), legendgroup=name, showlegend=col == 1,
                        row=1, col=col, hovertemplate=f"{name}: %{{y:.3f}} {unit}<extra>%{{x}}</extra>")
        fig.update_yaxes(title_text=f"time per decode step ({unit})", row=1, col=col)
        fig.update_xaxes(title_text="tensor-parallel size", type="category", row=1, col=col)
    fig.update_layout(barmode="stack")
    where = f"{rows_provenance(sel)}<br>{model}, {sel[0]['scheme']}, over {link}, context {sel[0]['context']:,} tokens"
    return finish(fig, f"Where one decode step's time goes under tensor parallelism: {model}", where,
                  notes=["compute is drawn only where it, not memory, binds the step (the step takes the larger)"])


MEASURED = "vLLM at TP=t"  # the measured points' legend name


def _measured_points(measured: Any, model: str, scheme: str) -> tuple[list[dict[str, Any]], str | None]:
    """The plain-TP rows of `measured` (a Shown, or a list of rows) that vLLM measured for this model and scheme,
    and, when there are none, the note that says so (the Shown's label: "not recorded yet", ...)."""
    if measured is None:
        return [], None
    value = measured.value if hasattr(measured, "value") else measured
    done = [r for r in value or [] if r.get("status") == "measured" and (r["model"], r["scheme"]) == (model, scheme)
            and r.get("pp", 1) == 1 and r.get("all_reduce", "custom") == "custom"]
    if done:
        return done, None
    why = (measured.label if value is None and hasattr(measured, "label") else
           "the runs given hold no measured row of this model and scheme")
    return [], f"{MEASURED}: not measured for {model} {scheme} ({why}); the lines are the model alone"


def tp_scaling(rows: Sequence[dict[str, Any]], model: str, batches: Sequence[int] = (1, 64),
               measured: Any = None) -> go.Figure:
    """Per-token latency and throughput against t, one line per link, the ideal t=1 / t dashed, from cost_rows.

    `measured`: vLLM's TP runs (experiments.parallel.tp_scaling()'s Shown, or its rows). Each row measured for this
    model and scheme with plain TP (no PP, vLLM's own all-reduce) at a drawn batch is a point on the curves (its
    median TPOT and batch / TPOT); with none, a note says "not measured", and no point is drawn.
    """
    fig = make_subplots(rows=len(batches), cols=2, horizontal_spacing=0.12, vertical_spacing=0.14,
                        subplot_titles=[f"{what}, batch {b}" for b in batches for what in ("latency", "throughput")])
    links = list(dict.fromkeys(r["link"] for r in _pick(rows, model=model)))
    points, missing = _measured_points(measured, model, _pick(rows, model=model)[0]["scheme"])
    in_legend = False  # the measured points' legend entry, once
    for i, b in enumerate(batches, 1):
        sel = _pick(rows, model=model, batch=b)
        unit, scale, log = time_axis([r["latency_s"] for r in sel] + [r["tpot_ms"] / 1e3 for r in points
                                                                      if r["batch"] == b])
        tps = sorted({r["t"] for r in sel} | {r["t"] for r in points if r["batch"] == b})
        for link in links:
            line = sorted((r for r in sel if r["link"] == link), key=lambda r: r["t"])
            symbols = ["circle" if r["fits"] else "circle-open" for r in line]
            for col, key, s in ((1, "latency_s", scale), (2, "throughput_tok_s", 1.0)):
                fig.add_scatter(x=[r["t"] for r in line], y=[r[key] * s for r in line], mode="lines+markers",
                                name=link, legendgroup=link, showlegend=i == 1 and col == 1,
                                line={"color": colour(link)}, marker={"symbol": symbols, "size": 9},
                                row=i, col=col, customdata=[r["communication_share"] for r in line],
                                hovertemplate="t=%{x}: %{y:.3g}, all-reduce share %{customdata:.0%}<extra>"
                                              f"{link}</extra>")
        base = next(r for r in sel if r["t"] == 1)
        ideal = "ideal (t=1 time / t)"
        fig.add_scatter(x=tps, y=[base["latency_s"] * scale / t for t in tps], mode="lines", name=ideal,
                        legendgroup=ideal, showlegend=i == 1, line={"color": colour(ideal), "dash": "dash"},
                        row=i, col=1)
        fig.add_scatter(x=tps, y=[base["throughput_tok_s"] * t for t in tps], mode="lines", name=ideal,
                        legendgroup=ideal, showlegend=False, line={"color": colour(ideal), "dash": "dash"},
                        row=i, col=2)
        here = sorted((r for r in points if r["batch"] == b), key=lambda r: r["t"])
        for col, y in ((1, [r["tpot_ms"] / 1e3 * scale for r in here]), (2, [r["decode_tok_s"] for r in here])):
            fig.add_scatter(x=[r["t"] for r in here], y=y, mode="markers", name=MEASURED, legendgroup=MEASURED,
                            showlegend=not in_legend and col == 1 and bool(here),
                            marker={"color": colour(MEASURED), "symbol": "diamond", "size": 12},
                            customdata=[[r.get("predicted_ms"), r.get("provenance")] for r in here], row=i, col=col,
                            hovertemplate="t=%{x}: %{y:.3g}; the model at its context %{customdata[0]:.3g} ms"
                                          "<extra>%{customdata[1]}</extra>")
        in_legend = in_legend or bool(here)
        fig.update_yaxes(title_text=f"per-token latency ({unit})", type="log" if log else None, row=i, col=1)
        fig.update_yaxes(title_text="throughput, all t GPUs (tok/s)", type="log", row=i, col=2)
        for col in (1, 2):
            _t_axis(fig, tps, row=i, col=col)
    where = f"{rows_provenance(sel)}<br>{model}, {sel[0]['scheme']}, context {sel[0]['context']:,} tokens"
    drawn = [r for r in points if r["batch"] in batches]
    if drawn:
        context = sum(r.get("context") or 0 for r in drawn) / len(drawn)
        where += (f"; diamonds: vLLM {_where([str(r.get('provenance')) for r in drawn])}, context ~{context:,.0f} "
                  "tokens")
    notes = [NOT_FIT] + ([missing] if missing else [] if drawn or measured is None else
                         [f"{MEASURED}: not measured at batch {', '.join(map(str, batches))}"])
    return finish(fig, f"What TP=t buys at decode: {model}", where, notes=notes, height=330 * len(batches))


def communication_share(rows: Sequence[dict[str, Any]], model: str, tps: Sequence[int] = (2, 4, 8)) -> go.Figure:
    """The all-reduces' share of the step against batch, one panel per t, one line per link, from cost_rows."""
    fig = make_subplots(rows=1, cols=len(tps), subplot_titles=[f"TP={t}" for t in tps], shared_yaxes=True,
                        horizontal_spacing=0.05)
    links = list(dict.fromkeys(r["link"] for r in _pick(rows, model=model)))
    for col, t in enumerate(tps, 1):
        sel = _pick(rows, model=model, t=t)
        for link in links:
            line = sorted((r for r in sel if r["link"] == link), key=lambda r: r["batch"])
            fig.add_scatter(x=[r["batch"] for r in line], y=[r["communication_share"] for r in line],
                            mode="lines+markers", name=link, legendgroup=link, showlegend=col == 1,
                            line={"color": colour(link)},
                            marker={"symbol": ["circle" if r["fits"] else "circle-open" for r in line]},
                            row=1, col=col, hovertemplate="batch %{x}: %{y:.0%}<extra>" + link + "</extra>")
        fig.add_hline(y=DOMINATES, line={"color": "gray", "dash": "dot"}, row=1, col=col)
        fig.update_xaxes(type="log", title_text="batch (sequences)", row=1, col=col)
    fig.update_yaxes(title_text="all-reduce share of the step (fraction)", tickformat=".0%", range=[0, 1],
                     row=1, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1])
    where = f"{rows_provenance(sel)}<br>{model}, {sel[0]['scheme']}, context {sel[0]['context']:,} tokens"
    return finish(fig, f"When communication dominates the step: {model}", where,
                  notes=[f"above the dotted line ({DOMINATES:.0%}) the step waits on all-reduces more than it "
                         "computes or reads memory; " + NOT_FIT])


def fit_heatmap(rows: Sequence[dict[str, Any]], gpus: Sequence[str] | None = None) -> go.Figure:
    """Model x scheme (rows) by GPU (columns): the smallest t that fits, from experiments.parallel.fit_rows."""
    if not rows:
        raise ValueError("fit_heatmap: pass lablib.experiments.parallel.fit_rows().")
    fixed = {"model", "scheme", "weights_GB", "provenance"}
    gpus = list(gpus or [k for k in rows[0] if k not in fixed])
    y = [f"{r['model']} {r['scheme']} ({r['weights_GB']:.0f} GB)" for r in rows]
    value = {1: 0, 2: 1, 4: 2, 8: 3}
    z = [[value.get(r[g], 4) for g in gpus] for r in rows]
    text = [[str(r[g]) for g in gpus] for r in rows]
    scale = [[k / 4, c] for k, c in enumerate(ordered_colours(4) + ["#d9d9d9"])]
    fig = go.Figure(go.Heatmap(x=gpus, y=y, z=z, text=text, texttemplate="%{text}", zmin=0, zmax=4,
                               colorscale=scale, showscale=False, xgap=2, ygap=2,
                               hovertemplate="%{y} on %{x}: smallest t = %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text="model, weight scheme (weights)", type="category")
    fig.update_xaxes(title_text="GPU (one of t)", type="category", side="bottom")
    where = ("simulated on this machine (lablib.hardware.fit.tp_fit_table, spec-sheet memory): a model, not a "
             "measurement")
    return finish(fig, "How many GPUs each shape needs: the smallest tensor-parallel size t", where,
                  notes=[("weights / t + one sequence's KV (heads split by t) + the engine's reserve within 90% of "
                          "one GPU; grey: not even t = 8")], height=120 + 40 * len(rows))


def two_gpus(rows: Sequence[dict[str, Any]]) -> go.Figure:
    """Throughput (against one GPU's) and per-token latency of each two-GPU plan, per batch, from two_gpu_rows."""
    if not rows:
        raise ValueError("two_gpus: pass lablib.experiments.parallel.two_gpu_rows(...).")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["throughput of both GPUs against one", "per-token latency"])
    plans = list(dict.fromkeys(r["plan"] for r in rows))
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    unit, scale, _ = time_axis(r["latency_s"] for r in rows if r["latency_s"] is not None)
    for plan in plans:
        sel = [next(r for r in rows if r["plan"] == plan and r["batch"] == b) for b in batches]
        text = ["" if r["fits"] else "does not fit" for r in sel]
        for col, key, s in ((1, "throughput_vs_one_gpu", 1.0), (2, "latency_s", scale)):
            fig.add_bar(x=[f"batch {b}" for b in batches], y=[r[key] * s if r["fits"] else 0 for r in sel],
                        name=plan, legendgroup=plan, showlegend=col == 1, marker_color=colour(plan), text=text,
                        textposition="outside", cliponaxis=False, row=1, col=col,
                        hovertemplate=f"{plan}, %{{x}}: %{{y:.3g}}<extra></extra>")
    fig.add_hline(y=2, line={"color": "gray", "dash": "dot"}, row=1, col=1)
    fig.update_yaxes(title_text="throughput against one GPU (x)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=f"per-token latency ({unit})", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="sequences per step (per plan: see the note)", type="category")
    fig.update_layout(barmode="group")
    r0 = rows[0]
    where = f"{rows_provenance(rows)}<br>{r0['model']}, {r0['label'].replace(', not a measurement', '')}"
    return finish(fig, f"Two GPUs: split each layer (TP), stage the layers (PP), or a second replica? {r0['model']}",
                  where, notes=[("PP keeps 2 microbatches in flight and replicas one batch each, so both hold twice "
                                 "TP's sequences; dotted: 2x one GPU"),
                                "against TP=1 on one GPU memory aside: for a model one GPU cannot hold, a GPU that could"])


_RECORDED = re.compile(r"^recorded on (.+), (\d{4}-\d{2}-\d{2})$")


def _where(labels: Sequence[str]) -> str:
    """Distinct provenance labels, with recorded ones merged per GPU ("recorded on X, d1 and d2")."""
    by_gpu: dict[str, list[str]] = {}
    rest = []
    for label in dict.fromkeys(labels):
        m = _RECORDED.match(label)
        if m:
            by_gpu.setdefault(m.group(1), []).append(m.group(2))
        else:
            rest.append(label)
    recorded = [f"recorded on {gpu}, {' and '.join(sorted(dates))}" for gpu, dates in by_gpu.items()]
    return "; ".join(rest + recorded)


def tp1_figure(predicted: Sequence[dict[str, Any]], measured: dict[str, Any]) -> go.Figure:
    """vLLM at TP=1 on the cost model's t=1 line: per-token latency and decode tok/s against batch.

    `predicted`: experiments.parallel.prediction_rows() (one line per model and scheme). `measured`: a short
    name per source -> its Shown rows (tp1_baseline(), recorded_tp1_points()); one whose value is None (not
    recorded yet) adds its label as a note, and a row that says "not measured" is left out (its table says why).
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=["per-token latency",
                                                                                 "decode throughput"])
    lines = list(dict.fromkeys((r["model"], r["scheme"]) for r in predicted))
    unit = "ms"
    for model, scheme in lines:
        sel = sorted((r for r in predicted if (r["model"], r["scheme"]) == (model, scheme)), key=lambda r: r["batch"])
        name = f"{model} {scheme}: cost model"
        for col, y in ((1, [r["latency_s"] * 1e3 for r in sel]), (2, [r["throughput_tok_s"] for r in sel])):
            fig.add_scatter(x=[r["batch"] for r in sel], y=y, mode="lines", name=name, legendgroup=name,
                            showlegend=col == 1, line={"color": colour(model), "dash": "dash"}, row=1, col=col)
    notes, labels = [], []
    for k, (source, shown) in enumerate(measured.items()):
        if shown.value is None:
            notes.append(f"{source}: {shown.label}")
            continue
        done = [r for r in shown.value if r.get("status") == "measured"]
        labels += [r["provenance"] for r in done]
        for model, scheme in dict.fromkeys((r["model"], r["scheme"]) for r in done):
            sel = sorted((r for r in done if (r["model"], r["scheme"]) == (model, scheme)), key=lambda r: r["batch"])
            name = f"{model} {scheme}: vLLM, {source}"
            custom = [[r["predicted_ms"], r["measured_over_predicted"]] for r in sel]
            for col, y in ((1, [r["tpot_ms"] for r in sel]), (2, [r["decode_tok_s"] for r in sel])):
                fig.add_scatter(x=[r["batch"] for r in sel], y=y, mode="markers", name=name, legendgroup=name,
                                showlegend=col == 1, marker={"color": colour(model), "size": 11,
                                                             "symbol": ["diamond", "circle", "square"][k % 3]},
                                customdata=custom, row=1, col=col,
                                hovertemplate="batch %{x}: %{y:.3g}; the model %{customdata[0]:.3g} ms, "
                                              "%{customdata[1]:.2f}x<extra></extra>")
    fig.update_xaxes(type="log", title_text="batch (sequences decoding together)")
    fig.update_yaxes(title_text=f"per-token latency, median TPOT ({unit})", type="log", row=1, col=1)
    fig.update_yaxes(title_text="decode throughput, batch / TPOT (tok/s)", type="log", row=1, col=2)
    where = "dashed: the cost model, simulated on this machine (spec-sheet peaks)" + (
        f"; points: vLLM {_where(labels)}" if labels else "")
    return finish(fig, "TP=1 on one GPU: vLLM against the cost model's prediction", where, synthetic=True,
                  notes=[*notes, ("the cost model assumes spec-sheet HBM bandwidth and no per-step overhead: "
                                  "a lower bound on latency")])
