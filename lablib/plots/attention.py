"""Attention-kernel pictures (lab 02): the IO model's prediction, then the kernels measured against sequence length.

- `prediction_figure`: the IO model per sequence on the H200: HBM bytes, extra memory and roofline time of
  naive and tiled (FA2-order) attention against N, with O(N^2) and O(N) slope guides. Both move ~N^2 bytes
  (tiling cuts the constant); only naive's extra memory is N^2 (S and P), flash keeps O(N) statistics.
- `kernel_sweep_figure`: the microbenchmark, per kernel, time and extra memory per sequence (median / batch,
  batch x N held constant) on log-log axes with the same guides, the IO model's lines beside it when it ran
  on an H200, out-of-memory points marked at the top of the panel.
- `tflops_figure`: useful TFLOP/s against N with the bf16 tensor peak; `decode_figure`: one query against a
  growing KV cache, achieved bandwidth against the HBM peak.
- `hf_prefill_figure`: the Hugging Face model's prefill time per `attn_implementation` against prompt length.

Each takes the `Shown` an experiment returned (`lablib.experiments.attention`) and states its label once, in
the title; with nothing measured or recorded it draws empty axes under that label. Kernel colours are fixed
here (`KERNEL_COLOURS`): style.colour's hash puts naive, sdpa_cudnn and flex on one colour.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..session import Shown
from .style import COLOURS, colour, finish, spans_decades

KERNELS = ("naive", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "flex", "vllm_fa3")
KERNEL_COLOURS = {
    "naive": COLOURS["hf-naive"],  # the baseline's grey, as in every lab
    "sdpa_math": "#8c564b", "sdpa_efficient": "#9467bd", "sdpa_flash": "#1f77b4", "sdpa_cudnn": "#bcbd22",
    "flex": "#e377c2", "vllm_fa3": COLOURS["vllm"],
    "eager": COLOURS["hf-naive"], "sdpa": "#3182bd", "flex_attention": "#e377c2",  # HF's attn_implementation names
    "IO model: naive": COLOURS["hf-naive"], "IO model: FA2": "#1f77b4",
    "O(N²) slope": "#555555", "O(N) slope": "#aaaaaa", "out of memory": "#000000",
    "bf16 tensor peak": "#d62728", "HBM peak": "#d62728",
}
DASH = {"IO model: naive": "dash", "IO model: FA2": "dash", "O(N²) slope": "dot", "O(N) slope": "dashdot",
        "bf16 tensor peak": "dot", "HBM peak": "dot"}
SIMULATED = "simulated on this machine (lablib.mechanisms.attention, the IO model at the H200's peaks: no kernel ran)"
MIB = 2**20
N_AXIS = "sequence length N (tokens)"


def series_colour(name: str) -> str:
    return KERNEL_COLOURS.get(name) or colour(name)


def _line(fig: go.Figure, name: str, xs: Sequence[float], ys: Sequence[float], col: int, shown: set[str],
          mode: str = "lines+markers", hover: str = "") -> None:
    """One trace, listed in the legend the first time its name appears in the figure."""
    fig.add_trace(go.Scatter(x=list(xs), y=list(ys), name=name, mode=mode, legendgroup=name,
                             showlegend=name not in shown, line={"color": series_colour(name), "dash": DASH.get(name)},
                             marker={"color": series_colour(name)}, hovertemplate=hover or None), row=1, col=col)
    shown.add(name)


def _guides(fig: go.Figure, xs: Sequence[float], high: tuple[float, float], low: tuple[float, float], col: int,
            shown: set[str]) -> None:
    """O(N^2) through `high` (x0, y0) and O(N) through `low`, across xs: slopes to read the curves against."""
    lo, hi = min(xs), max(xs)
    for name, (x0, y0), k in (("O(N²) slope", high, 2), ("O(N) slope", low, 1)):
        _line(fig, name, [lo, hi], [y0 * (lo / x0) ** k, y0 * (hi / x0) ** k], col, shown, mode="lines",
              hover=f"slope {k} on log-log axes<extra></extra>")


def _panels(y_titles: Sequence[str]) -> go.Figure:
    """A row of panels, one per y-axis title (with its unit), x the sequence length on a log axis.

    No subplot titles: their annotations push the figure's title out of the top margin."""
    fig = make_subplots(rows=1, cols=len(y_titles), horizontal_spacing=0.1)
    for i, y_title in enumerate(y_titles, start=1):
        fig.update_xaxes(title_text=N_AXIS, type="log", row=1, col=i)
        fig.update_yaxes(title_text=y_title, row=1, col=i)
    return fig


def _empty(title: str, where: str, y_title: str, x_title: str = N_AXIS) -> go.Figure:
    """Axes with nothing on them, under the label that says why (not recorded yet, not wired)."""
    fig = go.Figure()
    fig.update_xaxes(title_text=x_title, showticklabels=False)
    fig.update_yaxes(title_text=y_title, showticklabels=False)
    fig.add_annotation(text="nothing measured here, nothing recorded yet", xref="paper", yref="paper", x=0.5, y=0.5,
                       showarrow=False, font={"size": 14, "color": "gray"})
    return finish(fig, title, where, height=320)


def prediction_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """The IO model's rows (experiments.attention.prediction): bytes, extra memory and time per sequence against N."""
    if not rows:
        raise ValueError("prediction_figure: no rows. Fix: pass experiments.attention.prediction().")
    ns, first = [r["n"] for r in rows], rows[0]
    fig, shown = _panels(["HBM traffic (MiB)", "extra memory beyond Q, K, V, O (MiB)",
                          "roofline time (ms)"]), set()
    for col, (naive, flash, scale) in enumerate((("naive_bytes", "flash_bytes", 1 / MIB),
                                                 ("naive_extra_bytes", "flash_extra_bytes", 1 / MIB),
                                                 ("naive_time_s", "flash_time_s", 1e3)), start=1):
        for name, key in (("IO model: naive", naive), ("IO model: FA2", flash)):
            _line(fig, name, ns, [r[key] * scale for r in rows], col, shown)
        _guides(fig, ns, (ns[0], first[naive] * scale), (ns[0], first[flash] * scale), col, shown)
        fig.update_yaxes(type="log", row=1, col=col)
    title = (f"The IO model: naive vs tiled attention per sequence (d = {first['head_dim']}, {first['heads']} heads, "
             f"{'causal' if first['causal'] else 'full'}, bf16, SRAM {first['sram_bytes'] // 1024} KiB)")
    return finish(fig, title, SIMULATED, height=430, legend_below=True,
                  notes=["FA2 order: PyTorch's FLASH backend and vLLM's FA3; HBM only (L2 hits not counted)"])


def _ok(rows: list[dict[str, Any]], panel: str, d: int) -> list[dict[str, Any]]:
    return [r for r in rows if r["panel"] == panel and r["head_dim"] == d]


def _head_dim(shown: Shown, head_dim: int | None) -> int:
    dims = sorted({r["head_dim"] for r in shown.value["rows"]})
    if head_dim is not None and head_dim not in dims:
        raise ValueError(f"head_dim={head_dim}: this run measured head dims {dims}. Fix: pass one of them.")
    return head_dim if head_dim is not None else dims[-1]


def _short(reason: str) -> str:
    """A reason in one short line: its start and its last clause (the benchmark's hint, when it added one)."""
    head, _, hint = reason.rpartition("; ")
    return f"{head[:50]}...; {hint[:80]}" if head else reason[:110]


def _notes(rows: list[dict[str, Any]], extra: Sequence[str] = ()) -> list[str]:
    """Under the plot: the kernels that did not run here and why, the ones outside tolerance, anything else."""
    notes = list(extra)
    missing = {r["kernel"]: r["reason"] for r in rows if r["status"] == "unavailable"}
    notes += [f"not run: {k} ({_short(why)})" for k, why in missing.items()]
    wrong = sorted({f"{r['kernel']} N={r['N']}" for r in rows if r["status"] == "wrong"})
    return notes + ([f"outside tolerance (not drawn): {', '.join(wrong)}"] if wrong else [])


def _oom(fig: go.Figure, rows: list[dict[str, Any]], x: str, top: float, col: int, shown: set[str],
         who: str = "kernel") -> None:
    marks = [r for r in rows if r["status"] == "oom"]
    if marks:
        fig.add_trace(go.Scatter(x=[r[x] for r in marks], y=[top] * len(marks), mode="markers", name="out of memory",
                                 legendgroup="oom", showlegend="out of memory" not in shown,
                                 marker={"symbol": "x", "size": 11, "color": KERNEL_COLOURS["out of memory"]},
                                 text=[f"{r[who]}: out of memory at {r[x]:,}" for r in marks],
                                 hovertemplate="%{text}<extra></extra>"), row=1, col=col)
        shown.add("out of memory")


def _describe(prov: dict[str, Any], d: int, rows: list[dict[str, Any]]) -> str:
    cfg = prov["config"]
    return f"d = {d}, {rows[0]['heads']} heads, {'causal' if cfg['causal'] else 'full'}, {cfg['dtype']}"


def _sweep(shown: Shown, head_dim: int | None, panel: str) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]],
                                                                   dict[str, Any]]:
    """What every sweep figure starts from: the head dim drawn, its rows of one panel ("prefill" or "decode"),
    those that ran, and the run's provenance."""
    d = _head_dim(shown, head_dim)
    rows = _ok(shown.value["rows"], panel, d)
    return d, rows, [r for r in rows if r["status"] == "ok"], shown.value["provenance"]


def _kernel_lines(fig: go.Figure, rows: list[dict[str, Any]], value: Callable[[dict[str, Any]], float], col: int,
                  shown: set[str], hover: str) -> None:
    """One line per kernel (in KERNELS' order) over N, for the kernels the rows hold; `hover` formats with {k}."""
    for k in KERNELS:
        mine = sorted((r for r in rows if r["kernel"] == k), key=lambda r: r["N"])
        if mine:
            _line(fig, k, [r["N"] for r in mine], [value(r) for r in mine], col, shown, hover=hover.format(k=k))


def kernel_sweep_figure(shown: Shown, head_dim: int | None = None) -> go.Figure:
    """Per kernel, prefill time and extra memory per sequence against N (log-log), the IO model beside them."""
    title = "Attention kernels: time and extra memory per sequence against N"
    if shown.value is None:
        return _empty(title, shown.label, "time per sequence (ms)")
    d, rows, ok, prov = _sweep(shown, head_dim, "prefill")
    with_mem = [r for r in ok if r["extra_mem_bytes"] is not None]
    panels = ["time per sequence (ms)"] + (["extra memory per sequence (MiB)"] if with_mem else [])
    fig, names, ns = _panels(panels), set(), sorted({r["N"] for r in rows})
    series = {"time": lambda r: r["median_ms"] / r["batch"], "memory": lambda r: r["extra_mem_bytes"] / r["batch"] / MIB}
    pred = ((shown.value.get("prediction") or {}).get(d) or [])
    for col, (key, pkeys) in enumerate((("time", ("naive_time_s", "flash_time_s", 1e3)),
                                        ("memory", ("naive_extra_bytes", "flash_extra_bytes", 1 / MIB)))[:len(panels)],
                                       start=1):
        drawn = ok if key == "time" else with_mem
        _kernel_lines(fig, drawn, series[key], col, names, "{k}: N=%{{x:,}}, %{{y:.3g}}<extra></extra>")
        if pred:
            _line(fig, "IO model: naive", [p["n"] for p in pred], [p[pkeys[0]] * pkeys[2] for p in pred], col, names)
            _line(fig, "IO model: FA2", [p["n"] for p in pred], [p[pkeys[1]] * pkeys[2] for p in pred], col, names)
        ys = [series[key](r) for r in drawn]
        if ys:
            firsts = [min((r for r in drawn if r["kernel"] == k), key=lambda r: r["N"]) for k in {r["kernel"] for r in drawn}]
            points = sorted(((r["N"], series[key](r)) for r in firsts), key=lambda p: p[1])
            _guides(fig, ns, points[-1], points[0], col, names)
            if key == "time":
                _oom(fig, rows, "N", max(ys) * 3, col, names)
        fig.update_yaxes(type="log", row=1, col=col)
    notes = _notes(rows, ["per sequence: median time and peak memory beyond the inputs, divided by the batch "
                          f"(batch x N = {prov['config']['tokens']:,} tokens)"]
                   + ([shown.value["prediction_note"]] if shown.value.get("prediction_note") else [])
                   + ([] if with_mem else ["extra memory is measured on CUDA only (the allocator's peak)"]))
    return finish(fig, f"{title} ({_describe(prov, d, rows)})", shown.label, notes=notes, height=460,
                  legend_below=True)


def tflops_figure(shown: Shown, head_dim: int | None = None) -> go.Figure:
    """Useful TFLOP/s (causal pairs only) against N per kernel, with the GPU's bf16 tensor peak and the IO model's."""
    title = "Attention kernels: useful TFLOP/s against N"
    if shown.value is None:
        return _empty(title, shown.label, "useful TFLOP/s (TFLOP/s)")
    d, rows, ok, prov = _sweep(shown, head_dim, "prefill")
    fig, names = _panels(["useful TFLOP/s (TFLOP/s)"]), set()
    _kernel_lines(fig, ok, lambda r: r["tflops"], 1, names, "{k}: N=%{{x:,}}, %{{y:.3g}} TFLOP/s<extra></extra>")
    pred = (shown.value.get("prediction") or {}).get(d) or []
    if pred:
        _line(fig, "IO model: FA2", [p["n"] for p in pred], [p["flash_tflops"] for p in pred], 1, names)
    ys = [r["tflops"] for r in ok] + [p["flash_tflops"] for p in pred]
    peak = prov.get("peak_flops") if prov["config"]["dtype"] in ("bf16", "fp16") else None
    ns = sorted({r["N"] for r in rows})
    if peak:
        _line(fig, "bf16 tensor peak", [ns[0], ns[-1]], [peak / 1e12] * 2, 1, names, mode="lines",
              hover=f"{peak / 1e12:.1f} TFLOP/s ({prov.get('peak_source')})<extra></extra>")
    if ys:
        _oom(fig, rows, "N", (peak / 1e12 if peak else max(ys)) * 1.15, 1, names)
        fig.update_yaxes(type="log" if spans_decades(ys) else "linear", row=1, col=1)
    notes = _notes(rows, [] if peak else [f"no peak line: {prov.get('peak_source')}, {prov['config']['dtype']}"])
    return finish(fig, f"{title} ({_describe(prov, d, rows)})", shown.label, notes=notes, height=440,
                  legend_below=True)


def decode_figure(shown: Shown, head_dim: int | None = None) -> go.Figure:
    """One query against KV length per kernel: achieved bandwidth (K and V bytes / time) against the HBM peak."""
    title, y_title = "Decode: one query against a growing KV cache", "achieved bandwidth (GB/s)"
    if shown.value is None:
        return _empty(title, shown.label, y_title, "KV length (tokens)")
    d, rows, ok, prov = _sweep(shown, head_dim, "decode")
    fig, names = _panels([y_title]), set()
    fig.update_xaxes(title_text="KV length (tokens)")
    _kernel_lines(fig, ok, lambda r: r["achieved_gbps"], 1, names, "{k}: KV %{{x:,}}, %{{y:.1f}} GB/s<extra></extra>")
    bw = prov.get("hbm_bandwidth") if prov["config"]["device"] == "cuda" else None
    ns = sorted({r["N"] for r in rows})
    if bw:
        _line(fig, "HBM peak", [ns[0], ns[-1]], [bw / 1e9] * 2, 1, names, mode="lines",
              hover=f"{bw / 1e9:,.0f} GB/s ({prov.get('peak_source')})<extra></extra>")
    ys = [r["achieved_gbps"] for r in ok]
    if ys:
        fig.update_yaxes(type="log" if spans_decades(ys + ([bw / 1e9] if bw else [])) else "linear", row=1, col=1)
    notes = _notes(rows, ["short KV lengths are launch-bound: the events time the launch gaps too"]
                   + ([] if bw else ["no HBM line: this ran on the CPU"]))
    return finish(fig, f"{title} (d = {d}, {rows[0]['heads'] if rows else '?'} heads, {prov['config']['dtype']})",
                  shown.label, notes=notes, height=420, legend_below=True)


def hf_prefill_figure(shown: Shown) -> go.Figure:
    """The Hugging Face model's prefill time (and extra memory on CUDA) per attn_implementation against prompt length."""
    title = "Hugging Face prefill: time to the first token's logits by attn_implementation"
    if shown.value is None:
        return _empty(title, shown.label, "prefill time (ms)", "prompt length (tokens)")
    rows, prov = shown.value["rows"], shown.value["provenance"]
    ok = [r for r in rows if r["status"] == "ok"]
    with_mem = [r for r in ok if r["extra_mem_bytes"] is not None]
    fig = _panels(["prefill time (ms)"] + (["peak memory beyond the weights (GiB)"] if with_mem else []))
    names: set[str] = set()
    fig.update_xaxes(title_text="prompt length (tokens)")
    for col, (data, value) in enumerate(((ok, lambda r: r["median_ms"]),
                                         (with_mem, lambda r: r["extra_mem_bytes"] / 2**30))[:2 if with_mem else 1],
                                        start=1):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            mine = sorted((r for r in data if r["impl"] == impl), key=lambda r: r["prompt_tokens"])
            if mine:
                _line(fig, impl, [r["prompt_tokens"] for r in mine], [value(r) for r in mine], col, names,
                      hover=f"{impl}: %{{x:,}} tokens, %{{y:.3g}}<extra></extra>")
        if data:
            fig.update_yaxes(type="log", row=1, col=col)
            if col == 1:
                _oom(fig, rows, "prompt_tokens", max(value(r) for r in data) * 3, col, names, who="impl")
    skipped = {r["impl"]: r["reason"] for r in rows if r["status"] in ("skipped", "failed")}
    notes = [f"not run: {k} ({why[:110]})" for k, why in skipped.items()]
    notes.append(f"{prov['model']}, {prov['config']['dtype']}, batch 1; one forward of the prompt, median of "
                 f"{prov['config']['repeats']}")
    return finish(fig, title, shown.label, synthetic=bool(prov.get("synthetic")), notes=notes, height=440,
                  legend_below=True)
