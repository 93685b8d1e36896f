"""Figures of online serving: latency against offered load, and the server's own gauges over time.

`latency_vs_rate` is the serving engineer's main chart: one point per load test (a Result
from `lablib.bench.loadgen.run_online`), offered request rate on x, p50 and p99 of TTFT, TPOT
and inter-token latency on y. Past the server's capacity TTFT's tail climbs (requests
queue) while TPOT stays nearly flat: the queue, not the GPU, is what users feel.

`server_metrics_figure` draws the `/metrics` gauges each load test scraped (KV-cache
usage, running and waiting requests) against the load test's own clock, one line per rate.
`LiveServerMetrics` draws the same gauges while the test runs (a FigureWidget fed by the
scraper's thread); without anywidget it collects the samples and draws them at the end.

`token_gaps` checks the instrument itself: the gaps between a stream's token events as the
client read them. A client that keeps up reads them an engine step apart; a backlogged one
reads several at once, and the gaps under 0.2 ms pile up at the left edge.
"""
from __future__ import annotations

import math
import threading
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..bench.client import CLUMP_S, clumped_share, read_gaps
from .style import synthetic_note
from ..bench.prom import DEFAULT_GAUGES
from ..results.record import Result

GAUGE_TITLES = {"vllm:kv_cache_usage_perc": "KV-cache usage (fraction)",
                "vllm:num_requests_running": "requests running", "vllm:num_requests_waiting": "requests waiting"}


def _rate(r: Result) -> float:
    rate = r.config.get("rate")
    if not isinstance(rate, (int, float)):
        raise ValueError(f"Result {r.step!r} has no config['rate']: pass load-test Results from lablib.bench.loadgen.run_online.")
    return float(rate)


def _provenance(results: list[Result]) -> str:
    rec = [r for r in results if r.provenance == "recorded"]
    return f"recorded on {rec[0].hardware.get('gpu')}, {rec[0].recorded_at[:10]}" if rec else "live"


def latency_vs_rate(results: list[Result], target_ttft_s: float | None = None) -> go.Figure:
    """p50/p99 TTFT, TPOT and ITL (ms) against the offered rate; the burst (rate=inf) is drawn at the far right."""
    results = sorted(results, key=_rate)
    if not results:
        raise ValueError("latency_vs_rate: no Results. Fix: pass what lablib.experiments.serving.rate_sweep returned, or "
                         "lablib.results.reference.load_reference(prefix='serve-rate-').")
    finite = [_rate(r) for r in results if math.isfinite(_rate(r))]
    burst_x = max(finite) * 1.3 if finite else 1.0
    xs = [_rate(r) if math.isfinite(_rate(r)) else burst_x for r in results]
    prov = _provenance(results)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (ms)", "TPOT (ms)", "inter-token latency (ms)"))
    for col, key in enumerate(("ttft_s", "tpot_s", "itl_s"), start=1):
        for q, dash in (("p50", "solid"), ("p99", "dash")):
            ys = [(r.summary[key][q] or 0) * 1e3 for r in results]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{key[:-2].upper()} {q} ({prov})",
                                     line={"dash": dash}), 1, col)
    if target_ttft_s is not None:
        fig.add_hline(y=target_ttft_s * 1e3, line_dash="dot", annotation_text=f"TTFT target {target_ttft_s * 1e3:g} ms",
                      row=1, col=1)
    if any(not math.isfinite(_rate(r)) for r in results):
        fig.add_vline(x=burst_x, line_dash="dot", line_color="gray", annotation_text="all at once (rate=inf)")
    fig.update_xaxes(title_text="offered load (requests/s)")
    fig.update_layout(title=f"Latency under load: {prov}" + synthetic_note(results), showlegend=True)
    return fig


def throughput_vs_rate(results: list[Result]) -> go.Figure:
    """Achieved output tok/s against offered rate: it follows the load until the server saturates."""
    results = sorted(results, key=_rate)
    finite = [r for r in results if math.isfinite(_rate(r))]
    if not finite:
        raise ValueError("throughput_vs_rate: no Result with a finite rate. Fix: run rate_sweep with fractions.")
    prov = _provenance(results)
    fig = go.Figure(go.Scatter(x=[_rate(r) for r in finite], y=[r.summary["output_tok_s"] for r in finite],
                               mode="lines+markers", name=f"achieved output tok/s ({prov})"))
    burst = [r for r in results if not math.isfinite(_rate(r))]
    if burst:
        fig.add_hline(y=burst[0].summary["output_tok_s"], line_dash="dash",
                      annotation_text="capacity: everything at once (rate=inf)")
    fig.update_layout(title=f"Throughput follows the load until the server saturates: {prov}" + synthetic_note(results),
                      xaxis_title="offered load (requests/s)", yaxis_title="output tokens/s", showlegend=True)
    return fig


def _gauge_grid(names: tuple[str, ...], title: str, height: int, xtitle: str) -> go.Figure:
    """One row per gauge on a shared time axis: the frame of the static and the live /metrics figures."""
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=[GAUGE_TITLES.get(n, n) for n in names])
    fig.update_xaxes(title_text=xtitle, row=len(names), col=1)
    fig.update_layout(title=title, height=height, showlegend=True)
    return fig


def _gauge_line(rate: float, samples: list[dict[str, Any]], name: str, row: int) -> go.Scatter:
    """One load test's line in one gauge's row (its legend entry on the first row only)."""
    return go.Scatter(x=[s["t"] for s in samples], y=[s.get(name) for s in samples], mode="lines",
                      name=f"{rate:g} req/s", legendgroup=str(rate), showlegend=row == 1)


def server_metrics_figure(results: list[Result], names: tuple[str, ...] = DEFAULT_GAUGES) -> go.Figure:
    """The scraped gauges against each load test's clock, one line per rate."""
    with_metrics = [r for r in results if (r.engine_facts.get("server_metrics") or {}).get("samples")]
    if not with_metrics:
        raise ValueError("server_metrics_figure: none of these Results carries scraped /metrics samples. Fix: run "
                         "run_online with metrics on (the default).")
    fig = _gauge_grid(names, f"The server's view (/metrics): {_provenance(with_metrics)}" + synthetic_note(with_metrics),
                      220 * len(names) + 120, "seconds since the load test started")
    for r in sorted(with_metrics, key=_rate):
        for row, name in enumerate(names, start=1):
            fig.add_trace(_gauge_line(_rate(r), r.engine_facts["server_metrics"]["samples"], name, row), row, 1)
    return fig


class LiveServerMetrics:
    """A figure of the /metrics gauges that grows while a load test runs: pass `.update` as `on_metrics`.

    `update(rate, sample)` is called from the scraper's thread; a lock keeps traces whole.
    Without anywidget (no live FigureWidget) the samples are kept and `.figure` is drawn on demand.
    """

    def __init__(self, names: tuple[str, ...] = DEFAULT_GAUGES):
        self.names = tuple(names)
        self.samples: dict[float, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._traces: dict[tuple[float, str], int] = {}
        try:
            self.widget: Any = go.FigureWidget(self._base())
        except ImportError:
            self.widget = None

    def _base(self) -> go.Figure:
        return _gauge_grid(self.names, "The server's gauges, live (/metrics every scrape)", 200 * len(self.names) + 100,
                           "seconds since this load test started")

    def update(self, rate: float, sample: dict[str, Any]) -> None:
        with self._lock:
            self.samples.setdefault(rate, []).append(dict(sample))
            if self.widget is None:
                return
            with self.widget.batch_update():
                for row, name in enumerate(self.names, start=1):
                    key = (rate, name)
                    if key not in self._traces:
                        self.widget.add_trace(_gauge_line(rate, [], name, row), row, 1)
                        self._traces[key] = len(self.widget.data) - 1
                    trace = self.widget.data[self._traces[key]]
                    trace.x = tuple(trace.x or ()) + (sample["t"],)
                    trace.y = tuple(trace.y or ()) + (sample.get(name),)

    @property
    def figure(self) -> go.Figure:
        """A static figure of everything received so far."""
        fig = self._base()
        with self._lock:
            for rate, samples in self.samples.items():
                for row, name in enumerate(self.names, start=1):
                    fig.add_trace(_gauge_line(rate, samples, name, row), row, 1)
        return fig

    def display(self) -> Any:
        """The live widget (or, without anywidget, a note that the figure comes at the end)."""
        return self.widget if self.widget is not None else "live figure needs anywidget: the gauges are drawn after the run"


def token_gaps(results: list[Result]) -> go.Figure:
    """Histogram of the gaps between consecutive token events of each stream, as the client read them, one trace
    per load test, log-scaled, with the 0.2 ms line under which events were read in clumps (a backlogged client)."""
    if not results:
        raise ValueError("token_gaps: no Results. Fix: pass load-test Results from lablib.bench.loadgen.run_online.")
    fig = go.Figure()
    floor = CLUMP_S / 10  # gaps of 0 (events of one read) are drawn here, at the left edge of a log axis
    for r in results:
        gaps = read_gaps(r)
        if not gaps:
            raise ValueError(f"token_gaps: {r.step!r} has no per-token times: pass streamed load-test Results.")
        share = clumped_share(gaps)
        fig.add_trace(go.Histogram(x=[math.log10(max(g, floor) * 1e3) for g in gaps], nbinsx=60, opacity=0.6,
                                   name=f"{r.step}: {share:.0%} read in clumps"))
    fig.add_vline(x=math.log10(CLUMP_S * 1e3), line_dash="dash", annotation_text="0.2 ms: read together")
    fig.update_layout(barmode="overlay", title=f"Gaps between token events as the client read them ({_provenance(results)})"
                      + synthetic_note(results), xaxis_title="gap between token events (ms, log scale; 0 drawn at 0.02)",
                      yaxis_title="gaps", xaxis={"tickvals": list(range(-2, 4)),
                                                 "ticktext": ["0.01", "0.1", "1", "10", "100", "1000"]})
    return fig
