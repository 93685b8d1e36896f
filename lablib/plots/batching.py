"""Figures of measured runs: throughput, latency, memory and the whole journey, from Results only.

A benchmark number is only as good as the comparison it sits in, so every figure here
puts several runs side by side and reads nothing but `Result` records: a run made live on
a laptop and a run recorded on an H200 go through the same code, and a recorded run says
so in the figure's title (`style.provenance`), so nobody mistakes a shipped number for their own.

What each figure teaches:
- `throughput_vs_batch`: decode is memory-bound, so batching multiplies output tok/s almost
  for free until the KV cache rivals the weights; the dashed roofline is the most the GPU's
  bandwidth allows (lablib.hardware.roofline), drawn only where the GPU is in the peak table.
- `latency_cdf`: percentiles hide shape; the empirical CDF shows the whole distribution
  (static batching's staircase, a long tail of queued requests).
- `phase_breakdown`: where the time went, prompt processing (compute-bound) or token
  generation (bandwidth-bound).
- `memory_timeline`: what the run held over time, GPU memory (NVML) or, without a GPU, the
  process's resident memory.
- `journey` (in `plots.journey`): one bar per optimisation step, the road the labs travel
  from naive `generate` to a tuned server.

Request timelines (Gantt) live in `plots.scheduling`, KV-cache pictures in `plots.kv`; `lablib.plots`
re-exports them all. Every builder returns a plain `plotly.graph_objects.Figure`, which renders with no kernel (`fig.to_html()`), and follows the
rules in `style`: a rung's colour is the same in every figure, provenance is the title's second line.
"""
from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go

from ..results.record import Result
from .style import (
    ROOFLINE_UNKNOWN,
    batch_of,
    require_results,
    colour,
    finish,
    is_mixed,
    is_synthetic,
    provenance,
    spans_decades,
    step_labels,
    time_axis,
    series,
    trace_name,
)

__all__ = ["throughput_vs_batch", "latency_cdf", "memory_timeline", "phase_breakdown", "LATENCY_METRICS"]

LATENCY_METRICS = {"ttft": "time to first token", "tpot": "time per output token",
                   "e2e": "end-to-end latency", "itl": "inter-token latency"}
GIB, MIB = 2**30, 2**20


def throughput_vs_batch(results: list[Result],
                        batch_keys: tuple[str, ...] = ("batch_size",)) -> go.Figure:
    """Output tok/s against batch size, one line per engine, with the decode roofline where it is known.

    The batch size is the first integer `r.config[k]` for k in batch_keys; a Result with none
    is listed in a note rather than drawn. A vLLM sweep of its batch cap is drawn with
    batch_keys=("batch_size", "max_num_seqs") (the cap, not the batch it actually reached).
    Live and recorded runs of one engine are separate lines (the recorded one marked), in the engine's colour.
    """
    results = require_results(results, "throughput_vs_batch")
    mixed = is_mixed(results)
    groups: dict[str, list[Result]] = defaultdict(list)
    skipped = []
    for r in results:
        if batch_of(r, batch_keys) is None:
            skipped.append(r.step)
        else:
            groups[trace_name(r, series(r), mixed)].append(r)
    fig = go.Figure()
    unknown = False
    ys: list[float] = []
    for name, rs in groups.items():
        rs = sorted(rs, key=lambda r: batch_of(r, batch_keys))
        recorded = rs[0].provenance == "recorded" and mixed
        y = [r.summary["output_tok_s"] for r in rs]
        ys += y
        fig.add_scatter(x=[batch_of(r, batch_keys) for r in rs], y=y, mode="lines+markers", name=name,
                        text=[r.step for r in rs], line={"color": colour(name), "dash": "dot" if recorded else None},
                        marker={"symbol": "diamond" if recorded else "circle", "size": 8},
                        hovertemplate="%{text}<br>batch %{x}: %{y:,.1f} tok/s<extra></extra>")
        ceil = [r for r in rs if isinstance(r.roofline.get("ceiling_tok_s"), (int, float))]
        unknown |= any(r.roofline.get("ceiling_tok_s") == "unknown" for r in rs)
        if ceil:
            gpu = ceil[0].roofline.get("gpu_peak_entry") or ceil[0].hardware.get("gpu")
            ys += [r.roofline["ceiling_tok_s"] for r in ceil]
            fig.add_scatter(x=[batch_of(r, batch_keys) for r in ceil], y=[r.roofline["ceiling_tok_s"] for r in ceil],
                            mode="lines+markers", line={"dash": "dash", "color": colour(name)},
                            marker={"symbol": "line-ew-open", "size": 14},
                            name=trace_name(rs[0], f"{rs[0].engine} roofline ({gpu})", mixed),
                            hovertemplate="batch %{x}: ceiling %{y:,.0f} tok/s<extra></extra>")
    notes = [ROOFLINE_UNKNOWN] if unknown else []
    if skipped:
        notes.append(f"not drawn (no {' or '.join(batch_keys)} in config): {', '.join(skipped)}")
    batches = sorted({b for rs in groups.values() for b in (batch_of(r, batch_keys) for r in rs)})
    fig.update_xaxes(type="log", tickvals=batches, title_text="batch size (sequences decoding together)")
    if spans_decades(ys):
        fig.update_yaxes(type="log", title_text="output throughput (tok/s, log scale)")
    else:
        fig.update_yaxes(title_text="output throughput (tok/s)", rangemode="tozero")
    fig.update_layout(hovermode="closest")
    return finish(fig, "Throughput vs batch size", provenance(results),
                  synthetic=any(map(is_synthetic, results)), notes=notes)


def _latency_values(r: Result, metric: str) -> list[float]:
    if metric == "itl":
        return [x for q in r.requests for x in q.itls]
    return [v for v in (getattr(q, metric) for q in r.requests) if v is not None]


def latency_cdf(results: list[Result], metric: str = "ttft") -> go.Figure:
    """Empirical CDF of one latency metric per Result (ttft, tpot, e2e or itl).

    In milliseconds, or seconds once any value reaches 1 s; on a log axis when the values span decades
    (naive generate's TTFT runs from one prefill to the whole queue ahead of the last request).
    """
    if metric not in LATENCY_METRICS:
        raise ValueError(f"latency_cdf: metric={metric!r}; allowed {', '.join(map(repr, LATENCY_METRICS))}.")
    results = require_results(results, "latency_cdf")
    mixed = is_mixed(results)
    values = {id(r): sorted(_latency_values(r, metric)) for r in results}
    unit, scale, log = time_axis(v for vs in values.values() for v in vs)
    fig = go.Figure()
    empty = []
    for r in results:
        xs = [v * scale for v in values[id(r)]]
        if not xs:
            empty.append(r.step)
            continue
        name = trace_name(r, mixed=mixed)
        fig.add_scatter(x=xs, y=[(i + 1) / len(xs) for i in range(len(xs))], mode="lines+markers",
                        line_shape="hv", marker={"size": 4}, name=name,
                        line={"color": colour(name), "dash": "dot" if mixed and r.provenance == "recorded" else None},
                        hovertemplate=f"%{{x:.3g}} {unit}: %{{y:.0%}} of values at or below<extra></extra>")
    notes = [f"no {metric} values in: {', '.join(empty)}"] if empty else []
    fig.update_xaxes(title_text=f"{metric.upper()}, {LATENCY_METRICS[metric]} ({unit}{', log scale' if log else ''})",
                     type="log" if log else "linear")
    fig.update_yaxes(title_text="share of values at or below x (%)", range=[0, 1.02], tickformat=".0%")
    return finish(fig, f"{metric.upper()} distribution", provenance(results),
                  synthetic=any(map(is_synthetic, results)), notes=notes)


_SOURCES = {"nvml": "GPU memory used (whole device, NVML)",
            "rss": "process memory (RSS, CPU RAM: no GPU seen by NVML)"}


def memory_timeline(results: list[Result]) -> go.Figure:
    """Memory used over each run's time, in GiB or MiB; the title says GPU (NVML) or process RSS."""
    results = require_results(results, "memory_timeline")
    mixed = is_mixed(results)
    has = [bool(r.memory.get("t_s") and r.memory.get("used_bytes")) for r in results]
    drawn = [r for r, ok in zip(results, has) if ok]
    missing = [r.step for r, ok in zip(results, has) if not ok]
    sources = sorted({r.memory.get("source") or "unknown" for r in drawn})
    top = max((max(r.memory["used_bytes"]) for r in drawn), default=0)
    unit, scale = ("GiB", GIB) if top >= GIB else ("MiB", MIB)
    fig = go.Figure()
    for r in drawn:
        src = r.memory.get("source") or "unknown"
        base = trace_name(r, mixed=mixed)
        name = base + (f" [{src}]" if len(sources) > 1 else "")
        fig.add_scatter(x=r.memory["t_s"], y=[b / scale for b in r.memory["used_bytes"]], mode="lines",
                        name=name, line={"color": colour(base)},
                        hovertemplate=f"%{{x:.2f}} s: %{{y:.2f}} {unit}<extra></extra>")
    notes = [f"no memory timeline in: {', '.join(missing)}"] if missing else []
    what = " and ".join(_SOURCES.get(s, f"memory (source {s!r})") for s in sources) or "memory"
    fig.update_xaxes(title_text="time since run start (s)")
    fig.update_yaxes(title_text=f"used ({unit})", rangemode="tozero")
    return finish(fig, what[0].upper() + what[1:], provenance(results),
                  synthetic=any(map(is_synthetic, results)), notes=notes)


def phase_breakdown(results: list[Result]) -> go.Figure:
    """Stacked bars of total prefill and decode seconds per Result (summed over its requests), each labelled with
    its share of the run's summed time. Stacked, so linear: a log axis cannot stack."""
    results = require_results(results, "phase_breakdown")
    labels = step_labels(results)
    fig = go.Figure()
    totals = [(r.summary.get("prefill_s") or 0.0) + (r.summary.get("decode_s") or 0.0) for r in results]
    for phase in ("prefill", "decode"):
        name = f"{phase} (s)"
        ys = [r.summary.get(f"{phase}_s") or 0.0 for r in results]
        fig.add_bar(x=labels, y=ys, name=name, marker_color=colour(name), textposition="inside",
                    text=[f"{y / t:.0%}" if t else "" for y, t in zip(ys, totals)],
                    hovertemplate=f"%{{x}}<br>{phase}: %{{y:.3f}} s (%{{text}} of the run's summed time)<extra></extra>")
    # a share too small to print legibly inside its bar is left to the hover, not shrunk to a smudge
    fig.update_layout(barmode="stack", yaxis_title="time summed over requests (s)", xaxis_title="run (step)",
                      uniformtext={"minsize": 11, "mode": "hide"})
    return finish(fig, "Where the time went: prefill vs decode, summed over requests", provenance(results),
                  synthetic=any(map(is_synthetic, results)))
