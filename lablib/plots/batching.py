"""Figures of measured runs: throughput, latency, memory and the whole journey, from Results only.

A benchmark number is only as good as the comparison it sits in, so every figure here
puts several runs side by side and reads nothing but `Result` records: a run made live on
a laptop and a run recorded on an H200 go through the same code, and a recorded run says
so in its trace name (`Result.label`), so nobody mistakes a shipped number for their own.

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
- `journey`: one bar per optimisation step, throughput on top and TTFT below, the road the
  labs travel from naive `generate` to a tuned server.

Request timelines (Gantt) live in `plots_gantt`, KV-cache pictures in `plots_kv`; both are
re-exported here so `lablib.plots` is the one place to look. Every builder returns a plain
`plotly.graph_objects.Figure`, which renders with no kernel (`fig.to_html()`), and always
shows its legend, even for one trace, so a recorded run's label is never hidden.
"""
from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go

from ..results.record import Result
from .style import ROOFLINE_UNKNOWN, _batch, _note, _recorded_note, _require, _unique_labels, series_name

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
    """
    results = _require(results, "throughput_vs_batch")
    groups: dict[str, list[Result]] = defaultdict(list)
    skipped = []
    for r in results:
        if _batch(r, batch_keys) is None:
            skipped.append(r.label)
        else:
            groups[series_name(r, r.engine)].append(r)
    fig = go.Figure()
    unknown = False
    for name, rs in groups.items():
        rs = sorted(rs, key=lambda r: _batch(r, batch_keys))
        fig.add_scatter(x=[_batch(r, batch_keys) for r in rs], y=[r.summary["output_tok_s"] for r in rs],
                        mode="lines+markers", name=name, text=[r.step for r in rs],
                        hovertemplate="%{text}<br>batch %{x}: %{y:.1f} tok/s<extra></extra>")
        ceil = [r for r in rs if isinstance(r.roofline.get("ceiling_tok_s"), (int, float))]
        unknown |= any(r.roofline.get("ceiling_tok_s") == "unknown" for r in rs)
        if ceil:
            gpu = ceil[0].roofline.get("gpu_peak_entry") or ceil[0].hardware.get("gpu")
            fig.add_scatter(x=[_batch(r, batch_keys) for r in ceil], y=[r.roofline["ceiling_tok_s"] for r in ceil],
                            mode="lines+markers", line={"dash": "dash"}, marker={"symbol": "line-ew-open", "size": 14},
                            name=f"{name}: decode roofline ({gpu})",
                            hovertemplate="batch %{x}: ceiling %{y:.0f} tok/s<extra></extra>")
    if unknown:
        _note(fig, ROOFLINE_UNKNOWN)
    if skipped:
        _note(fig, f"not drawn (no {' or '.join(batch_keys)} in config): {', '.join(skipped)}", y=-0.2)
    batches = sorted({b for rs in groups.values() for b in (_batch(r, batch_keys) for r in rs)})
    fig.update_xaxes(type="log", tickvals=batches, title_text="batch size (sequences decoding together)")
    fig.update_yaxes(title_text="output tokens / s", rangemode="tozero")
    fig.update_layout(title="Throughput vs batch size" + _recorded_note(results), hovermode="closest",
                      showlegend=True)
    return fig


def _latency_values(r: Result, metric: str) -> list[float]:
    if metric == "itl":
        return [x for q in r.requests for x in q.itls]
    return [v for v in (getattr(q, metric) for q in r.requests) if v is not None]


def latency_cdf(results: list[Result], metric: str = "ttft") -> go.Figure:
    """Empirical CDF of one latency metric per Result, in milliseconds (ttft, tpot, e2e or itl)."""
    if metric not in LATENCY_METRICS:
        raise ValueError(f"latency_cdf: metric={metric!r}; allowed {', '.join(map(repr, LATENCY_METRICS))}.")
    results = _require(results, "latency_cdf")
    fig = go.Figure()
    empty = []
    for r in results:
        xs = sorted(v * 1e3 for v in _latency_values(r, metric))
        if not xs:
            empty.append(r.label)
            continue
        fig.add_scatter(x=xs, y=[(i + 1) / len(xs) for i in range(len(xs))], mode="lines+markers",
                        line_shape="hv", marker={"size": 4}, name=series_name(r),
                        hovertemplate="%{x:.2f} ms: %{y:.0%} of values at or below<extra></extra>")
    if empty:
        _note(fig, f"no {metric} values in: {', '.join(empty)}")
    fig.update_xaxes(title_text=f"{metric.upper()} ({LATENCY_METRICS[metric]}), ms")
    fig.update_yaxes(title_text="fraction of values <= x", range=[0, 1.02], tickformat=".0%")
    fig.update_layout(title=f"{metric.upper()} distribution" + _recorded_note(results), showlegend=True)
    return fig


_SOURCES = {"nvml": "GPU memory used (whole device, NVML)",
            "rss": "process memory (RSS, CPU RAM: no GPU seen by NVML)"}


def memory_timeline(results: list[Result]) -> go.Figure:
    """Memory used over each run's time, in GiB or MiB; the title says GPU (NVML) or process RSS."""
    results = _require(results, "memory_timeline")
    has = [bool(r.memory.get("t_s") and r.memory.get("used_bytes")) for r in results]
    drawn = [r for r, ok in zip(results, has) if ok]
    missing = [r.label for r, ok in zip(results, has) if not ok]
    sources = sorted({r.memory.get("source") or "unknown" for r in drawn})
    top = max((max(r.memory["used_bytes"]) for r in drawn), default=0)
    unit, scale = ("GiB", GIB) if top >= GIB else ("MiB", MIB)
    fig = go.Figure()
    for r in drawn:
        src = r.memory.get("source") or "unknown"
        name = series_name(r) + (f" [{src}]" if len(sources) > 1 else "")
        fig.add_scatter(x=r.memory["t_s"], y=[b / scale for b in r.memory["used_bytes"]], mode="lines",
                        name=name, hovertemplate=f"%{{x:.2f}} s: %{{y:.2f}} {unit}<extra></extra>")
    if missing:
        _note(fig, f"no memory timeline in: {', '.join(missing)}")
    what = " and ".join(_SOURCES.get(s, f"memory (source {s!r})") for s in sources) or "memory"
    fig.update_xaxes(title_text="time since run start (s)")
    fig.update_yaxes(title_text=f"used ({unit})", rangemode="tozero")
    fig.update_layout(title=what[0].upper() + what[1:] + _recorded_note(results), showlegend=True)
    return fig


def phase_breakdown(results: list[Result]) -> go.Figure:
    """Stacked bars of total prefill and decode seconds per Result (summed over its requests)."""
    results = _require(results, "phase_breakdown")
    labels = _unique_labels(results)
    fig = go.Figure()
    for phase, colour in (("prefill", "#636efa"), ("decode", "#ef553b")):
        fig.add_bar(x=labels, y=[r.summary.get(f"{phase}_s") or 0.0 for r in results], name=f"{phase} (s)",
                    marker_color=colour, hovertemplate=f"%{{x}}<br>{phase}: %{{y:.3f}} s<extra></extra>")
    fig.update_layout(barmode="stack", title="Where the time went: prefill vs decode, summed over requests"
                      + _recorded_note(results), yaxis_title="seconds (sum over requests)")
    return fig


