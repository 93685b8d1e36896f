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
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from ..results.record import Result
from .style import _synthetic

ROW_KEYS = ("request_id", "arrival", "start", "first_token", "finish")


def result_gantt_rows(result: Result) -> list[dict[str, Any]]:
    """One Gantt row per request of a real run; the bar ends at `finished`, else at `last_token`.

    Requests with no first token (an interrupted run) are left out. Each row carries `label`
    (Result.label, so a recorded run says where it was recorded) and `last_token`.
    """
    rows = []
    for q in result.requests:
        end = q.finished if q.finished is not None else q.last_token
        if q.first_token is None or end is None:
            continue
        rows.append({"request_id": q.request_id, "arrival": q.arrival,
                     "start": q.start if q.start is not None else q.arrival, "first_token": q.first_token,
                     "last_token": q.last_token, "finish": end, "label": result.label})
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
    """
    rows = _check_rows(rows)
    time_unit = time_unit or ("s" if "label" in rows[0] else "cost-model units")
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
                    orientation="h", name=prefix + "running (start to finish)",
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
    fig.update_yaxes(type="category", autorange="reversed", title_text="request")
    fig.update_xaxes(title_text=f"time ({time_unit})")
    fig.update_layout(title=title, barmode="overlay", showlegend=True, height=max(300, 22 * len(rows) + 150))
    return fig


def schedule_tradeoff(schedules: dict[str, Any], ttft_target: float | None = None) -> go.Figure:
    """Throughput vs p99 TTFT for several scheduler settings (simulator ScheduleResults), with a TTFT target line."""
    if not schedules:
        raise ValueError("schedule_tradeoff: no schedules. Fix: pass {label: ScheduleResult}.")
    fig = go.Figure(go.Scatter(
        x=[s.summary.p99_ttft for s in schedules.values()], y=[s.summary.throughput for s in schedules.values()],
        text=list(schedules), mode="lines+markers+text", textposition="top center", name="simulated"))
    if ttft_target is not None:
        fig.add_vline(x=ttft_target, line_dash="dash", annotation_text=f"TTFT target {ttft_target:g}")
    fig.update_layout(title="Throughput vs tail latency (simulator, cost-model units)",
                      xaxis_title="p99 TTFT", yaxis_title="output tokens per unit time", showlegend=True)
    return fig


def scheduler_figure(rows: list[dict[str, Any]], ttft_target_s: float | None = None) -> go.Figure:
    """Measured throughput vs p99 TTFT, one point per vLLM engine configuration, with a TTFT target line."""
    if not rows:
        raise ValueError("scheduler_figure: no rows. Fix: run lablib.experiments.sweeps.scheduler_rows().")
    prov = rows[0].get("provenance", "live")
    text = [f"seqs={r['max_num_seqs']}, tokens={r.get('max_num_batched_tokens') or 'default'}" for r in rows]
    fig = go.Figure(go.Scatter(x=[(r["ttft_p99_s"] or 0) * 1e3 for r in rows], y=[r["output_tok_s"] for r in rows],
                               text=text, mode="markers+text", textposition="top center", name=f"vLLM ({prov})"))
    if ttft_target_s is not None:
        fig.add_vline(x=ttft_target_s * 1e3, line_dash="dash", annotation_text=f"TTFT target {ttft_target_s * 1e3:g} ms")
    fig.update_layout(title=f"Scheduler knobs on vLLM: throughput vs tail latency ({prov})" + _synthetic(rows),
                      xaxis_title="p99 TTFT (ms)", yaxis_title="output tokens/s", showlegend=True)
    return fig
