"""Request timelines: one Gantt bar per request, where batching policies show their shape.

A request's life is arrival -> start (it waits for a batch slot) -> first token (its
prefill is done) -> finish (its response is handed back). Drawn one bar per request, the
scheduling policy is visible at a glance: static batching makes staircases (a batch starts
together, and every member is returned only when its longest member ends, so the
"last token" mark sits well before the bar's end), continuous batching makes a dense,
ragged front (requests join and leave every step).

The same picture serves the simulators (`lablib.mechanisms.batching.ScheduleResult.rows()`,
time in the cost model's units) and real runs (`result_gantt_rows(result)`, seconds since
the run started): both give rows with request_id, arrival, start, first_token, finish.
A run's bars take its rung's colour (`style.colour`); a simulated policy takes the colour of the
engine that implements it (static: HF's, continuous: vLLM's).

`schedule_tradeoff` and `scheduler_figure` put one point per setting, each its own legend entry
(labels written beside points collide where two settings land close together), on log axes where
the tail latencies span decades.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from ..results.record import Result
from .style import (
    rows_synthetic,
    colour,
    finish,
    ordered_colours,
    palette_for,
    provenance,
    rows_provenance,
    spans_decades,
    time_axis,
)

SIMULATED = "simulated on this machine (lablib.mechanisms.batching cost model: no engine ran)"

ROW_KEYS = ("request_id", "arrival", "start", "first_token", "finish")


def result_gantt_rows(result: Result) -> list[dict[str, Any]]:
    """One Gantt row per request of a real run; the bar ends at `finished`, else at `last_token`.

    Requests with no first token (an interrupted run) are left out. Each row carries `label`
    (the step: the legend's name), `provenance` (where it was measured, said once in the title) and `last_token`.
    """
    rows = []
    for q in result.requests:
        end = q.finished if q.finished is not None else q.last_token
        if q.first_token is None or end is None:
            continue
        rows.append({"request_id": q.request_id, "arrival": q.arrival,
                     "start": q.start if q.start is not None else q.arrival, "first_token": q.first_token,
                     "last_token": q.last_token, "finish": end, "label": result.step,
                     "provenance": provenance([result]), "synthetic": result.model.get("synthetic") or None})
    return rows


def _check_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = list(rows)
    if not rows:
        raise ValueError("gantt: no rows to draw. Fix: pass ScheduleResult.rows() or result_gantt_rows(result).")
    missing = [k for k in ROW_KEYS if k not in rows[0]]
    if missing:
        raise ValueError(f"gantt: rows lack {missing}; each row needs {list(ROW_KEYS)} "
                         "(ScheduleResult.rows() and result_gantt_rows(result) give them).")
    return rows


def gantt(rows: Sequence[dict[str, Any]], title: str = "Request timeline", time_unit: str | None = None) -> go.Figure:
    """One horizontal bar per request from start to finish, a marker at its first token.

    Waiting (arrival to start) is drawn as a pale bar, and where rows carry a `last_token`
    earlier than `finish` (static batching holding finished requests) it is marked too.
    Rows from several runs (different `label` or `policy`) get their own traces. time_unit
    labels the axis: by default "s" for real runs' rows, "cost-model units" for the simulators'.
    The provenance (the rows' own, or "simulated") is the title's second line unless `title` says it already.
    """
    rows = _check_rows(rows)
    real = "label" in rows[0]
    time_unit = time_unit or ("s" if real else "cost-model units")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row.get("label") or row.get("policy") or ""), []).append(row)
    several = len(groups) > 1
    fig = go.Figure()
    for label, group in groups.items():
        ys = [f"{label} {r['request_id']}" if several else str(r["request_id"]) for r in group]
        prefix = f"{label}: " if label else ""
        waits = [r["start"] - r["arrival"] for r in group]
        if any(w > 0 for w in waits):
            fig.add_bar(y=ys, x=waits, base=[r["arrival"] for r in group], orientation="h",
                        name=prefix + "waiting", marker_color="rgba(150,150,150,0.35)",
                        hovertemplate="%{y}: waited %{x:.3g} " + time_unit + "<extra></extra>")
        fig.add_bar(y=ys, x=[r["finish"] - r["start"] for r in group], base=[r["start"] for r in group],
                    orientation="h", name=prefix + "running (start to finish)", marker_color=colour(label or "running"),
                    hovertemplate="%{y}: ran %{x:.3g} " + time_unit + "<extra></extra>")
        fig.add_scatter(y=ys, x=[r["first_token"] for r in group], mode="markers", name=prefix + "first token",
                        marker={"symbol": "diamond", "size": 8, "color": "black"},
                        hovertemplate="%{y}: first token at %{x:.3g} " + time_unit + "<extra></extra>")
        late = [(y, r["last_token"]) for r, y in zip(group, ys)
                if r.get("last_token") is not None and r["last_token"] < r["finish"]]
        if late:
            fig.add_scatter(y=[y for y, _ in late], x=[t for _, t in late],
                            mode="markers", name=prefix + "last token (returned later)",
                            marker={"symbol": "line-ns-open", "size": 12, "color": "crimson"},
                            hovertemplate="%{y}: last token at %{x:.3g} " + time_unit + "<extra></extra>")
    fig.update_yaxes(type="category", autorange="reversed", title_text="request (id)")
    fig.update_xaxes(title_text=f"time ({time_unit})")
    fig.update_layout(barmode="overlay")
    where = "; ".join(dict.fromkeys(str(r["provenance"]) for r in rows if r.get("provenance"))) or (
        "" if real else SIMULATED)
    return finish(fig, title, where, synthetic=any(r.get("synthetic") for r in rows),
                  height=max(320, 22 * len(rows) + 230), legend_below=True)


def _tradeoff(fig: go.Figure, labels: list[str], xs: list[float], ys: list[float], colours: dict[str, str],
              x_unit: str, y_unit: str) -> None:
    """The settings as one grey line in the order given (hover names each point), then one marker per setting
    in the legend: no text on the plot to collide where two settings land close together."""
    fig.add_scatter(x=xs, y=ys, text=labels, mode="lines", line={"color": "lightgray"}, showlegend=False,
                    name="in the order given", hovertemplate="%{text}: p99 TTFT %{x:.3g} " + x_unit
                    + ", %{y:.3g} " + y_unit + "<extra></extra>")
    for label, x, y in zip(labels, xs, ys):
        fig.add_scatter(x=[x], y=[y], mode="markers", name=label, marker={"size": 12, "color": colours[label]},
                        hovertemplate=label + ": p99 TTFT %{x:.3g} " + x_unit + ", %{y:.3g} " + y_unit
                        + "<extra></extra>")


def schedule_tradeoff(schedules: dict[str, Any], ttft_target: float | None = None) -> go.Figure:
    """Throughput vs p99 TTFT for several scheduler settings (simulator ScheduleResults), with a TTFT target line.

    Settings are coloured in the order given (a sweep: dark to light); the TTFT axis is logarithmic
    when the settings' tails span decades.
    """
    if not schedules:
        raise ValueError("schedule_tradeoff: no schedules. Fix: pass {label: ScheduleResult}.")
    labels = list(schedules)
    xs = [s.summary.p99_ttft for s in schedules.values()]
    fig = go.Figure()
    _tradeoff(fig, labels, xs, [s.summary.throughput for s in schedules.values()],
              dict(zip(labels, ordered_colours(len(labels)))), "units", "tokens/unit")
    if ttft_target is not None:
        fig.add_vline(x=ttft_target, line_dash="dash", annotation_text=f"TTFT target {ttft_target:g}",
                      annotation_position="top left")
    log = spans_decades(xs + ([ttft_target] if ttft_target else []))
    fig.update_xaxes(title_text="p99 TTFT (cost-model units" + (", log scale)" if log else ")"),
                     type="log" if log else "linear")
    fig.update_yaxes(title_text="throughput (output tokens per cost-model unit)")
    return finish(fig, "Throughput vs tail latency", SIMULATED, legend_below=True)


def scheduler_figure(rows: list[dict[str, Any]], ttft_target_s: float | None = None) -> go.Figure:
    """Measured throughput vs p99 TTFT, one point per vLLM engine configuration, with a TTFT target line."""
    if not rows:
        raise ValueError("scheduler_figure: no rows. Fix: run lablib.experiments.sweeps.scheduler_rows().")
    rows = sorted(rows, key=lambda r: (r["max_num_seqs"], r.get("max_num_batched_tokens") or 0))
    labels = [f"max_num_seqs={r['max_num_seqs']}, budget={r.get('max_num_batched_tokens') or 'default'}"
              for r in rows]
    ttft = [r["ttft_p99_s"] for r in rows]
    unit, scale, log = time_axis(ttft + ([ttft_target_s] if ttft_target_s else []))
    fig = go.Figure()
    _tradeoff(fig, labels, [(t or 0) * scale for t in ttft], [r["output_tok_s"] for r in rows], palette_for(labels),
              unit, "tok/s")
    if ttft_target_s is not None:
        fig.add_vline(x=ttft_target_s * scale, line_dash="dash", annotation_position="top left",
                      annotation_text=f"TTFT target {ttft_target_s * scale:g} {unit}")
    fig.update_xaxes(title_text=f"p99 TTFT ({unit}{', log scale' if log else ''})", type="log" if log else "linear")
    fig.update_yaxes(title_text="output throughput (tok/s)")
    return finish(fig, "Scheduler knobs on vLLM: throughput vs tail latency", rows_provenance(rows),
                  synthetic=rows_synthetic(rows), legend_below=True)
