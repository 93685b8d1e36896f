"""Figures of online serving: latency against offered load, and the server's own gauges over time.

`latency_vs_rate` is the serving engineer's main chart: one point per load test (a Result
from `lablib.bench.loadgen.run_online`), offered request rate on x, p50 and p99 of TTFT, TPOT
and inter-token latency on y. Past the server's capacity TTFT's tail climbs (requests
queue) while TPOT stays nearly flat: the queue, not the GPU, is what users feel.

`server_metrics_figure` draws the `/metrics` gauges each load test scraped (KV-cache
usage, running and waiting requests) against the load test's own clock, one line per rate, in
one colour per rate in every row (`rate_colours`: the sweep's order, the burst in red), its legend
entry once.
`LiveServerMetrics` draws the same gauges while the test runs (an Output widget fed by the
scraper's thread, redrawn at most once a second); without ipywidgets it collects the samples and draws
them at the end.

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
from ..bench.prom import DEFAULT_GAUGES
from ..results.record import Result
from .style import (
    colour,
    finish,
    is_synthetic,
    ordered_colours,
    provenance,
    spans_decades,
)

GAUGE_TITLES = {"vllm:kv_cache_usage_perc": "KV cache used (%)",
                "vllm:num_requests_running": "running (requests)", "vllm:num_requests_waiting": "waiting (requests)"}
GAUGE_SCALE = {"vllm:kv_cache_usage_perc": 100.0}  # vLLM reports a fraction; drawn in percent
BURST_COLOUR = "#d62728"


def _rate(r: Result) -> float:
    rate = r.config.get("rate")
    if not isinstance(rate, (int, float)):
        raise ValueError(f"Result {r.step!r} has no config['rate']: pass load-test Results from lablib.bench.loadgen.run_online.")
    return float(rate)


def rate_name(rate: float) -> str:
    """A load test's legend name: "13.8 req/s", or "burst (all at once)" for rate=inf."""
    return f"{rate:.3g} req/s" if math.isfinite(rate) else "burst (all at once)"


def rate_colours(rates: list[float]) -> dict[float, str]:
    """One colour per offered rate: finite rates along a sequential scale in increasing order, the burst red.

    Depends only on the set of rates, so the rows of one figure (and the live figure, once every rate has
    arrived) agree with each other and with the legend."""
    finite = sorted({r for r in rates if math.isfinite(r)})
    out = dict(zip(finite, ordered_colours(len(finite))))
    out.update({r: BURST_COLOUR for r in rates if not math.isfinite(r)})
    return out


def _rate_axis(results: list[Result]) -> tuple[list[float], list[float], list[str]]:
    """x of each Result (the burst one step past the largest finite rate), and the axis' ticks and their text."""
    finite = [_rate(r) for r in results if math.isfinite(_rate(r))]
    burst_x = max(finite) * 1.3 if finite else 1.0
    xs = [_rate(r) if math.isfinite(_rate(r)) else burst_x for r in results]
    ticks = sorted(set(xs))
    return xs, ticks, [f"{t:.3g}" if t in finite else "burst" for t in ticks]


METRIC_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL"}


def latency_vs_rate(results: list[Result], target_ttft_s: float | None = None) -> go.Figure:
    """p50/p99 TTFT, TPOT and ITL (ms) against the offered rate; the burst (rate=inf) is drawn at the far right.

    One colour per metric, p50 solid and p99 dashed; a panel's y axis is logarithmic when its values span decades
    (TTFT from a prefill at low load to a queue at the burst)."""
    results = sorted(results, key=_rate)
    if not results:
        raise ValueError("latency_vs_rate: no Results. Fix: pass what lablib.experiments.serving.runs.rate_sweep returned, or "
                         "lablib.results.reference.load_reference(prefix='serve-rate-').")
    xs, ticks, ticktext = _rate_axis(results)
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09,
                        subplot_titles=("time to first token", "time per output token", "inter-token latency"))
    for col, key in enumerate(METRIC_NAMES, start=1):
        metric = METRIC_NAMES[key]
        values = []
        for q, dash in (("p50", "solid"), ("p99", "dash")):
            ys = [(r.summary[key][q] or 0) * 1e3 for r in results]
            values += ys
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{metric} {q}",
                                     line={"dash": dash, "color": colour(metric)},
                                     hovertemplate=f"%{{x:.3g}} req/s: {metric} {q} %{{y:.1f}} ms<extra></extra>"), 1, col)
        if target_ttft_s is not None and col == 1:
            values.append(target_ttft_s * 1e3)
        log = spans_decades(values)
        fig.update_yaxes(title_text=f"{metric} ({'ms, log scale' if log else 'ms'})", type="log" if log else "linear",
                         row=1, col=col)
    if target_ttft_s is not None:
        fig.add_hline(y=target_ttft_s * 1e3, line_dash="dot", annotation_text=f"target {target_ttft_s * 1e3:g} ms",
                      annotation_position="top left", row=1, col=1)
    fig.update_xaxes(title_text="offered load (requests/s)", tickvals=ticks, ticktext=ticktext, tickangle=-45)
    return finish(fig, "Latency under load", provenance(results), synthetic=any(map(is_synthetic, results)),
                  legend_below=True, height=470)


def throughput_vs_rate(results: list[Result]) -> go.Figure:
    """Achieved output tok/s against offered rate: it follows the load until the server saturates."""
    results = sorted(results, key=_rate)
    finite = [r for r in results if math.isfinite(_rate(r))]
    if not finite:
        raise ValueError("throughput_vs_rate: no Result with a finite rate. Fix: run rate_sweep with fractions.")
    engine = finite[0].engine
    fig = go.Figure(go.Scatter(x=[_rate(r) for r in finite], y=[r.summary["output_tok_s"] for r in finite],
                               mode="lines+markers", name=f"{engine}: achieved", line={"color": colour(engine)},
                               hovertemplate="%{x:.3g} req/s offered: %{y:,.0f} output tok/s<extra></extra>"))
    burst = [r for r in results if not math.isfinite(_rate(r))]
    if burst:
        fig.add_hline(y=burst[0].summary["output_tok_s"], line_dash="dash", line_color=BURST_COLOUR,
                      annotation_text="capacity: everything at once (rate=inf)", annotation_position="bottom right")
    fig.update_xaxes(title_text="offered load (requests/s)")
    fig.update_yaxes(title_text="output throughput (tok/s)", rangemode="tozero")
    return finish(fig, "Throughput follows the load until the server saturates", provenance(results),
                  synthetic=any(map(is_synthetic, results)))


def _gauge_grid(names: tuple[str, ...], height: int, xtitle: str) -> go.Figure:
    """One row per gauge on a shared time axis: the frame of the static and the live /metrics figures."""
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for row, name in enumerate(names, start=1):
        fig.update_yaxes(title_text=GAUGE_TITLES.get(name, f"{name} (value)"), rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text=xtitle, row=len(names), col=1)
    fig.update_layout(height=height, showlegend=True)
    return fig


def _gauge_line(rate: float, samples: list[dict[str, Any]], name: str, row: int, colour: str) -> go.Scatter:
    """One load test's line in one gauge's row, in its rate's colour (its legend entry on the first row only)."""
    scale = GAUGE_SCALE.get(name, 1.0)
    return go.Scatter(x=[s["t"] for s in samples], y=[_scaled(s.get(name), scale) for s in samples], mode="lines",
                      name=rate_name(rate), legendgroup=str(rate), showlegend=row == 1, line={"color": colour},
                      hovertemplate=f"{rate_name(rate)}, %{{x:.1f}} s: %{{y:.3g}}<extra></extra>")


def _scaled(v: float | None, scale: float) -> float | None:
    return None if v is None else v * scale


def server_metrics_figure(results: list[Result], names: tuple[str, ...] = DEFAULT_GAUGES) -> go.Figure:
    """The scraped gauges against each load test's clock, one line per rate, one colour per rate in every row."""
    with_metrics = [r for r in results if (r.engine_facts.get("server_metrics") or {}).get("samples")]
    if not with_metrics:
        raise ValueError("server_metrics_figure: none of these Results carries scraped /metrics samples. Fix: run "
                         "run_online with metrics on (the default).")
    fig = _gauge_grid(names, 200 * len(names) + 160, "seconds since the load test started (s)")
    colours = rate_colours([_rate(r) for r in with_metrics])
    for r in sorted(with_metrics, key=_rate):
        for row, name in enumerate(names, start=1):
            fig.add_trace(_gauge_line(_rate(r), r.engine_facts["server_metrics"]["samples"], name, row,
                                      colours[_rate(r)]), row, 1)
    return finish(fig, "The server's view (/metrics)", provenance(with_metrics),
                  synthetic=any(map(is_synthetic, with_metrics)))


class LiveServerMetrics:
    """A figure of the /metrics gauges that grows while a load test runs: pass `.update` as `on_metrics`.

    `update(rate, sample)` is called from the scraper's thread, in the process whose client is timing token
    arrivals: any Python it runs holds the GIL and delays the client's reads (a 5-11 ms parse every 0.5 s
    clumped a quarter of the lab client's token gaps on the H200). So it stays cheap: it appends the sample and,
    at most every `min_interval_s`, redraws from plain dicts (the layout validated once, at construction; a new
    rate adds one small trace per gauge and recolours the rest, `rate_colours`, so rows and legend agree), shown
    unvalidated: a few ms, where a full plotly build takes ~25-40 ms. `flush` draws what a throttled update
    left out: pass it as the sweep's `on_result`. The figure lives in a `FigureArea` (an Output widget), so it survives a
    browser refresh; without ipywidgets the samples are kept and `.figure` draws them on demand.
    """

    def __init__(self, names: tuple[str, ...] = DEFAULT_GAUGES, min_interval_s: float = 1.0):
        self.names = tuple(names)
        self.samples: dict[float, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        base = self._base()
        for row, name in enumerate(self.names, start=1):  # where each gauge's row draws: its axes, read once
            base.add_trace(go.Scatter(x=[], y=[]), row, 1)
        self._axes = {name: (t.xaxis, t.yaxis) for name, t in zip(self.names, base.data)}
        self._layout = base.to_dict()["layout"]
        self._traces: dict[tuple[float, str], dict[str, Any]] = {}  # (rate, gauge) -> its trace, as plain JSON
        try:
            from ..widgets.figure import FigureArea  # deferred: ipywidgets, plotly (through lablib.widgets.figure)

            self.area: Any = FigureArea(self._base(), min_interval_s=min_interval_s)
        except ImportError:
            self.area = None

    def _base(self) -> go.Figure:
        fig = _gauge_grid(self.names, 200 * len(self.names) + 140, "seconds since this load test started (s)")
        return finish(fig, "The server's gauges as they arrive (/metrics every scrape)", "live on this machine's vLLM server")

    def update(self, rate: float, sample: dict[str, Any]) -> None:
        with self._lock:
            new_rate = rate not in self.samples
            self.samples.setdefault(rate, []).append(dict(sample))
            if self.area is None:
                return
            if new_rate:
                colours = rate_colours(list(self.samples))
                for row, name in enumerate(self.names, start=1):
                    trace = _gauge_line(rate, [], name, row, colours[rate]).to_plotly_json()
                    trace["xaxis"], trace["yaxis"] = self._axes[name]
                    self._traces[(rate, name)] = trace
                for (r, _), trace in self._traces.items():
                    trace["line"] = {**trace.get("line", {}), "color": colours[r]}
            elif not self.area.due():
                return
            self._draw()

    def _draw(self) -> None:
        """Fill every trace from its samples (plain lists: cheap) and show them all (the lock held)."""
        for (rate, name), trace in self._traces.items():
            scale = GAUGE_SCALE.get(name, 1.0)
            trace["x"] = [x["t"] for x in self.samples[rate]]
            trace["y"] = [_scaled(x.get(name), scale) for x in self.samples[rate]]
        self.area.show(go.Figure({"data": list(self._traces.values()), "layout": self._layout}, _validate=False))

    def flush(self, _result: Any = None) -> None:
        """Draw every sample received so far, now (what the interval held back at the end of a test). Takes an
        ignored argument so it can be a sweep's `on_result`: it then runs between load tests, never during one."""
        with self._lock:
            if self.area is not None and self.samples:
                self._draw()

    def _build(self) -> go.Figure:
        fig = self._base()
        colours = rate_colours(list(self.samples))
        for rate, samples in self.samples.items():
            for row, name in enumerate(self.names, start=1):
                fig.add_trace(_gauge_line(rate, samples, name, row, colours[rate]), row, 1)
        return fig

    @property
    def figure(self) -> go.Figure:
        """A static figure of everything received so far (validated: for the end of the run, tests, exports)."""
        with self._lock:
            return self._build()

    def display(self) -> Any:
        """The live figure's Output widget (or, without ipywidgets, a note that the figure comes at the end)."""
        return self.area.output if self.area is not None else "live figure needs ipywidgets: the gauges are drawn after the run"


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
                                   name=f"{r.step}: {share:.0%} read in clumps", marker_color=colour(r.step)))
    fig.add_vline(x=math.log10(CLUMP_S * 1e3), line_dash="dash", annotation_text="0.2 ms: read together")
    fig.update_layout(barmode="overlay", xaxis_title="gap between token events (ms, log scale; 0 drawn at 0.02)",
                      yaxis_title="token gaps (count)", xaxis={"tickvals": list(range(-2, 4)),
                                                         "ticktext": ["0.01", "0.1", "1", "10", "100", "1000"]})
    return finish(fig, "Gaps between token events as the client read them", provenance(results),
                  synthetic=any(map(is_synthetic, results)))


def capacity_figure(found: dict[str, Any], where: str) -> go.Figure:
    """The capacity search's probes: attainment (share of requests meeting the SLO) against the offered rate, each
    with its 95% interval, the SLO's percentile as a line, the answer's interval shaded. `where`: its label."""
    probes = sorted(found["probes"], key=lambda p: p["rate"])
    if not probes:
        raise ValueError(f"capacity_figure: no probes to draw ({found.get('verdict', 'nothing measured')}). Fix: pass "
                         "what ServingLab.capacity returned after a search that ran.")
    percent = float(found["slo"].rsplit(" for ", 1)[1].split("%")[0])
    fig = go.Figure()
    for held, name, col in ((True, "holds", "#2ca02c"), (False, "fails", BURST_COLOUR)):
        ps = [p for p in probes if p["holds"] is held]
        fig.add_trace(go.Scatter(
            x=[p["rate"] for p in ps], y=[100 * p["attainment"] for p in ps], mode="markers", name=name,
            marker={"color": col, "size": 9, "symbol": ["circle-open" if p["uncertain"] else "circle" for p in ps]},
            error_y={"type": "data", "symmetric": False, "array": [100 * (p["interval"][1] - p["attainment"]) for p in ps],
                     "arrayminus": [100 * (p["attainment"] - p["interval"][0]) for p in ps]},
            hovertemplate="%{x:.3g} req/s: %{y:.1f}% met the SLO<extra></extra>"))
    fig.add_hline(y=percent, line_dash="dash", line_color="gray", annotation_text=f"SLO: {percent:g}% of requests",
                  annotation_position="bottom left")
    lo, hi = found["interval_rps"]
    if lo is not None and hi is not None:
        fig.add_vrect(x0=lo, x1=hi, fillcolor="#2ca02c", opacity=0.12, line_width=0)
    fig.update_xaxes(title_text="offered load (requests/s)", type="log" if spans_decades(p["rate"] for p in probes)
                     else "linear")
    fig.update_yaxes(title_text="requests meeting the SLO (%)", range=[0, 105])
    return finish(fig, "The highest load that meets the latency target", where,
                  notes=[found["slo"], found["verdict"].split(": ", 1)[-1] if lo is not None and hi is not None
                         else found["verdict"]])


def pareto_figure(tuned: dict[str, Any], where: str) -> go.Figure:
    """The tuning front (`experiments.serving.pareto`): every load test as tok/s per GPU (x) against one user's tok/s
    (y), the front drawn through the points no other beats on both, each labelled with its setting. `where`: its label."""
    points = [p for p in tuned.get("points", []) if p.get("tok_s_per_user")]
    if not points:
        raise ValueError("pareto_figure: no points to draw. Fix: pass what ServingLab.pareto kept (lab.tuned) after it "
                         "ran.")

    def setting(p: dict[str, Any]) -> str:
        scheme = "" if p["scheme"] == "simulated" else f"{p['scheme']}, "
        return f"{scheme}max_num_seqs {p['max_num_seqs']}, budget {p['max_num_batched_tokens']}, {p['concurrency']} in flight"

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[p["tok_s_per_gpu"] for p in points], y=[p["tok_s_per_user"] for p in points],
                             mode="markers", name="every load test", marker={"color": "#bbbbbb", "size": 8},
                             text=[setting(p) for p in points], hovertemplate="%{text}<br>%{x:,.0f} tok/s per GPU, "
                             "%{y:,.1f} tok/s per user<extra></extra>"))
    best = tuned["front"]
    fig.add_trace(go.Scatter(x=[p["tok_s_per_gpu"] for p in best], y=[p["tok_s_per_user"] for p in best],
                             mode="lines+markers", name="the front: nothing beats these on both",
                             line={"color": colour("front"), "shape": "hv"}, marker={"size": 10},
                             text=[setting(p) for p in best], hovertemplate="%{text}<br>%{x:,.0f} tok/s per GPU, "
                             "%{y:,.1f} tok/s per user<extra></extra>"))
    fig.update_xaxes(title_text="output tok/s per GPU (the operator's)",
                     type="log" if spans_decades(p["tok_s_per_gpu"] for p in points) else "linear")
    fig.update_yaxes(title_text="tok/s per user (1 / TPOT p50)")
    return finish(fig, "Tokens per GPU against tokens per user: the settings worth choosing between", where,
                  notes=[f"{len(best)} of {len(points)} load tests on the front"])
