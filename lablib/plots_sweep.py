"""Figures of engine-restart sweeps (rows from lablib.sweeps, live or recorded)."""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .plots import synthetic_line


def _synthetic(rows: list[dict[str, Any]]) -> str:
    return synthetic_line(any(str(r.get("model", "")).startswith("synthetic:") for r in rows))


def gpu_memory_utilization_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """KV capacity vs gpu_memory_utilization, and VRAM before start / after close of each engine."""
    if not rows:
        raise ValueError("gpu_memory_utilization_figure: no rows. Fix: run lablib.sweeps.gpu_memory_utilization_rows().")
    g = [r["gpu_memory_utilization"] for r in rows]
    prov = rows[0].get("provenance", "live")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("KV-cache capacity (tokens)", "GPU memory used (MiB)"))
    fig.add_trace(go.Scatter(x=g, y=[r["kv_tokens"] for r in rows], mode="lines+markers",
                             name=f"KV tokens ({prov})"), 1, 1)
    for key, label in (("vram_before_bytes", "before engine start"), ("peak_used_bytes", "peak during run"),
                       ("vram_after_close_bytes", "after close")):
        fig.add_trace(go.Bar(x=[str(x) for x in g], y=[(r.get(key) or 0) / 2**20 for r in rows],
                             name=f"{label} ({prov})"), 1, 2)
    fig.update_xaxes(title_text="gpu_memory_utilization")
    fig.update_layout(title=f"gpu_memory_utilization sweep: {prov}" + _synthetic(rows), barmode="group", showlegend=True)
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
        raise ValueError("scheduler_figure: no rows. Fix: run lablib.sweeps.scheduler_rows().")
    prov = rows[0].get("provenance", "live")
    text = [f"seqs={r['max_num_seqs']}, tokens={r.get('max_num_batched_tokens') or 'default'}" for r in rows]
    fig = go.Figure(go.Scatter(x=[(r["ttft_p99_s"] or 0) * 1e3 for r in rows], y=[r["output_tok_s"] for r in rows],
                               text=text, mode="markers+text", textposition="top center", name=f"vLLM ({prov})"))
    if ttft_target_s is not None:
        fig.add_vline(x=ttft_target_s * 1e3, line_dash="dash", annotation_text=f"TTFT target {ttft_target_s * 1e3:g} ms")
    fig.update_layout(title=f"Scheduler knobs on vLLM: throughput vs tail latency ({prov})" + _synthetic(rows),
                      xaxis_title="p99 TTFT (ms)", yaxis_title="output tokens/s", showlegend=True)
    return fig
