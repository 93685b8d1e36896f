"""The rules every figure follows, and the one formatter of colours, provenance, units and titles.

A reader should take a figure in at a glance, and compare two figures without reading their legends:

1. One colour per rung or engine, in every figure: `colour(name)` maps a step or engine name to a
   colour that does not depend on the order traces are added or on what else the figure shows
   (`COLOURS` for the known rungs and series, a ramp for `hf-static-b<N>` by batch size, a hash of
   the name for anything else). A figure of one sweep colours its points by the sweep's own order
   instead (`ordered_colours`, `palette_for`).
2. Provenance once per figure: where the runs were measured (`provenance(results)`: "live on this
   CPU", "recorded on NVIDIA H200, 2026-11-29", "simulated ...") is the title's second line, never
   in a legend entry. A figure mixing live and recorded runs marks the recorded traces with
   RECORDED_MARK and says so in that line.
3. Every axis with its unit in parentheses, "(s)", "(tok/s)", "(GiB)"; `time_axis` picks seconds
   or milliseconds and a log scale when the values span decades.
4. No clipped or overlapping labels: axes grow their margins (`finish`), notes go under the plot,
   text drawn outside bars is not clipped.

`tests/plots/test_rules.py` renders every builder on the recorded data and checks what it can.
`series_name`, `_recorded_note`, `_unique_labels` keep their old meaning (a name with its provenance)
for callers that want it in text, not in a legend.
"""
from __future__ import annotations

import math
import re
import textwrap
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import plotly.graph_objects as go

from ..models.architecture import LABEL as SYNTHETIC_LABEL
from ..results.record import Result

ROOFLINE_UNKNOWN = "roofline unknown for this hardware (CPU or GPU not in the table)"
RECORDED_MARK = " *"  # appended to a recorded trace's name in a figure that also shows live runs

# Rungs, engines and the series several figures share. A new rung adds its colour here.
COLOURS: dict[str, str] = {
    "hf-naive": "#7f7f7f",  # the baseline: grey
    "hf-static": "#e6550d",  # the engine; its rungs hf-static-b<N> follow HF_STATIC_RAMP
    "vllm": "#2ca02c",
    "vllm-server": "#17becf",
    "vllm-8b-journey": "#2ca02c",  # the H200 recordings of a rung take the rung's colour
    "vllm-fp8": "#9467bd",
    "vllm-fp8-8b-journey": "#9467bd",
    "serve-rate-inf": "#17becf",
    "static": "#e6550d",  # the simulators' policies: drawn like the engines that implement them
    "continuous": "#2ca02c",
    "prefill (s)": "#636efa",
    "decode (s)": "#ef553b",
    "holding real K/V": "#00cc96",
    "reserved, never written (waste)": "#ef553b",
    "KV-cache capacity": "#2ca02c",
    "peak during run": "#e6550d",
    "before engine start": "#7f7f7f",
    "after close": "#1f77b4",
    "time to first token": "#636efa",
    "end-to-end latency": "#ef553b",
    "TTFT": "#636efa",
    "TPOT": "#e6550d",
    "ITL": "#2ca02c",
}
# hf-static-b1, b2, b4, ... b512: light orange through red and purple to blue, so batch size reads as an order
HF_STATIC_RAMP = ["#fdae61", "#f46d43", "#d73027", "#a50026", "#762a83", "#542788", "#2b3b8f", "#1f5fa8",
                  "#2a85c0", "#4ba6d0"]
# a rung run again with another attention kernel (hf-static-b16-sdpa): not its batch's ramp colour, so the two differ
ATTENTION_VARIANTS = {"hf-naive": "#35978f", "hf-static": "#e7298a"}
# what makes a step a variant of its engine rather than one more batch size of it: another attention kernel, or
# speculative decoding (a draft model, n-gram lookup, an EAGLE head)
VARIANT = re.compile(r"-(sdpa|draft-k\d+|ngram-k\d+|eagle[\w-]*)\b")
# names not in COLOURS: picked by a hash of the name (stable across runs and processes)
PALETTE = ["#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39",
           "#7b4173", "#3182bd", "#d6616b"]
SEQUENTIAL = "Viridis"  # ordered sweeps (rates, settings): dark to light in the sweep's order


def colour(name: str) -> str:
    """The colour of a rung, engine or shared series, the same in every figure.

    Exact names in COLOURS first; `hf-static-b<N>...` takes HF_STATIC_RAMP[log2 N]; anything else a hash
    of the name into PALETTE (so two recorded vLLM steps drawn side by side stay apart). A recorded trace's
    RECORDED_MARK is ignored, so a run and its recording share a colour.
    """
    name = base_name(name)
    if name in COLOURS:
        return COLOURS[name]
    attention = re.match(r"(hf-naive|hf-static)(-b\d+)?-sdpa\b", name)
    if attention:
        return ATTENTION_VARIANTS[attention.group(1)]
    m = re.match(r"hf-static-b(\d+)\b", name)
    if m:
        b = max(1, int(m.group(1)))
        return HF_STATIC_RAMP[min(len(HF_STATIC_RAMP) - 1, round(math.log2(b)))]
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def series(r: Result) -> str:
    """The line a run belongs to in a figure against batch size: its engine, or for a variant of it (another
    attention kernel, a speculative method) the engine and the variant (`hf-static-sdpa`, `hf-naive-ngram-k4`), so
    naive, n-gram and draft at batch 1 are three points, not one line drawn straight up."""
    m = VARIANT.search(r.step)
    return r.engine + m.group(0) if m else r.engine


def base_name(trace_name: str) -> str:
    """A trace name without the recorded mark: the key colours are looked up by."""
    return trace_name.removesuffix(RECORDED_MARK)


def ordered_colours(n: int, scale: str = SEQUENTIAL) -> list[str]:
    """n colours along a sequential scale (dark to light): for the points of one ordered sweep."""
    from plotly.colors import sample_colorscale  # deferred: plotly

    if n <= 0:
        return []
    return sample_colorscale(scale, [0.0] if n == 1 else [0.85 * i / (n - 1) for i in range(n)], colortype="rgb")


def palette_for(names: Iterable[str]) -> dict[str, str]:
    """Distinct colours for the names of one figure, assigned in sorted order (so not by the order drawn)."""
    ordered = sorted(set(names))
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(ordered)}


def series_name(r: Result, base: str | None = None) -> str:
    """`base` (default the step) plus, for a recorded run, where it was recorded: for text, not legends."""
    return r.label if base is None else base + r.label[len(r.step):]


def trace_name(r: Result, base: str | None = None, mixed: bool = False) -> str:
    """A legend name for r: `base` (default the step), with RECORDED_MARK when `mixed` and r is recorded."""
    name = r.step if base is None else base
    return name + (RECORDED_MARK if mixed and r.provenance == "recorded" else "")


def is_mixed(results: Sequence[Result]) -> bool:
    """Whether a figure of these runs shows live and recorded runs together (so recorded traces are marked)."""
    return len({r.provenance for r in results}) > 1


def is_synthetic(r: Result) -> bool:
    """Whether r ran a synthetic checkpoint (random weights of a real architecture)."""
    return bool(r.model.get("synthetic")) or str(r.model.get("name", "")).startswith("synthetic:")


def synthetic_line(synthetic: bool) -> str:
    """The title line that says a figure shows synthetic weights ('' when it does not)."""
    return f"<br><sup>{SYNTHETIC_LABEL}</sup>" if synthetic else ""


def synthetic_note(results: list[Result]) -> str:
    """synthetic_line for a figure of these runs: shown when any of them used synthetic weights."""
    return synthetic_line(any(is_synthetic(r) for r in results))


def _live_where(r: Result) -> str:
    gpu = r.hardware.get("gpu")
    return f"live on {gpu}" if gpu else "live on this CPU"


def _recorded_where(rs: Sequence[Result]) -> str:
    by_gpu: dict[str, list[str]] = defaultdict(list)
    for r in rs:
        date = r.recorded_at[:10]
        gpu = r.hardware.get("gpu") or "CPU"
        if date not in by_gpu[gpu]:
            by_gpu[gpu].append(date)
    return "; ".join(f"recorded on {gpu}, {' and '.join(sorted(dates))}" for gpu, dates in by_gpu.items())


def provenance(results: Sequence[Result]) -> str:
    """Where these runs were measured, in one line: the figure's provenance, said once.

    "live on this CPU", "recorded on NVIDIA H200, 2026-11-29", or, for a mix,
    "* recorded on NVIDIA H200, 2026-11-29; the rest live on this CPU" (the recorded traces carry RECORDED_MARK).
    """
    recorded = [r for r in results if r.provenance == "recorded"]
    live = sorted({_live_where(r) for r in results if r.provenance != "recorded"})
    if recorded and live:
        return f"{RECORDED_MARK.strip()} {_recorded_where(recorded)}; the rest {' and '.join(live)}"
    return _recorded_where(recorded) if recorded else " and ".join(live)


def rows_provenance(rows: Sequence[dict[str, Any]]) -> str:
    """The provenance of sweep rows (each row's "provenance", as the experiments label them), said once."""
    return "; ".join(dict.fromkeys(str(r.get("provenance") or "live") for r in rows))


def _recorded_note(results: list[Result]) -> str:
    gpus = sorted({r.hardware.get("gpu") or "CPU" for r in results if r.provenance == "recorded"})
    note = f"<br><sup>includes runs recorded on {', '.join(gpus)}, not measured here</sup>" if gpus else ""
    return note + synthetic_note(results)


PROVENANCE_WORDS = re.compile(r"recorded on|live on|simulated", re.IGNORECASE)


def finish(fig: go.Figure, title: str, where: str, *, synthetic: bool = False, notes: Sequence[str] = (),
           height: int | None = None, legend_below: bool = False) -> go.Figure:
    """Title with the provenance as its second line (unless `title` already says it), notes under the plot,
    margins that grow to fit tick labels and titles. Returns fig."""
    lines = [] if PROVENANCE_WORDS.search(title) or not where else [where]
    text = title + "".join(f"<br><sup>{line}</sup>" for line in lines) + synthetic_line(
        synthetic and SYNTHETIC_LABEL not in title)
    n_lines = text.count("<br>")
    wrapped = [line for note in notes for line in wrap(note)]  # a long note wraps, never runs off the figure's edge
    for i, note in enumerate(wrapped):  # under the x axis' title, one line each
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, xanchor="left", y=0, yanchor="top",
                           yshift=-64 - 18 * i, showarrow=False, align="left", font={"size": 11, "color": "gray"})
    subplot_titles = any(a.yref == "paper" and a.y is not None and a.y >= 1 and a.yanchor == "bottom"
                         for a in fig.layout.annotations)  # make_subplots' titles sit in the top margin too
    bottom = (80 + 18 * len(wrapped) if wrapped else 60) + (24 * legend_rows(fig) + 16 if legend_below else 0)
    # the title hangs from the top; the margin holds all its lines, and the subplot titles below them
    fig.update_layout(title={"text": text, "x": 0.01, "xanchor": "left", "y": 1, "yref": "container",
                             "yanchor": "top", "pad": {"t": 26}},
                      margin={"t": 62 + 22 * n_lines + (30 if subplot_titles else 0), "b": bottom}, showlegend=True)
    if legend_below:  # a wide legend under the plot, so the plots keep the full width
        fig.update_layout(legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 0.01, "yanchor": "bottom",
                                  "yref": "container"})
    if height is not None:
        fig.update_layout(height=height)
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


NOTE_CHARS = 120  # a note's line at 11 px fits a 1,024 px page's plot width in about this many characters
LEGEND_WIDTH = 800  # px a horizontal legend has at 1,024 px before it wraps to another row


def wrap(note: str, width: int = NOTE_CHARS) -> list[str]:
    """A note in lines of at most `width` characters, broken at spaces."""
    return textwrap.wrap(note, width) or [note]


def legend_rows(fig: go.Figure) -> int:
    """About how many rows a horizontal legend of this figure takes at 1,024 px (its entries' text, 7 px a
    character, plus the symbol): what the bottom margin must hold so the legend does not climb into the notes.

    A legend of titled groups (`legendgrouptitle`) lays each group out as a column, its title over its entries,
    and puts the columns side by side while they fit: its rows are, per line of columns, the tallest column's."""
    shown = [t for t in fig.data if t.showlegend is not False and t.name]
    if not shown:
        return 0
    if any(t.legendgrouptitle and t.legendgrouptitle.text for t in shown):
        return _grouped_legend_rows(shown)
    rows, used = 1, 0
    for name in dict.fromkeys(t.name for t in shown):
        w = _entry_width(name)
        if used and used + w > LEGEND_WIDTH:
            rows, used = rows + 1, 0
        used += w
    return rows


def _entry_width(text: str) -> int:
    return 50 + 7 * len(re.sub(r"<[^>]+>", "", text))


def _grouped_legend_rows(traces: list) -> int:
    groups: dict[str, list[str]] = defaultdict(list)  # in the order drawn, as plotly lists them
    titles: dict[str, str] = {}
    for t in traces:
        key = t.legendgroup or t.name
        if t.name not in groups[key]:
            groups[key].append(t.name)
        titles.setdefault(key, t.legendgrouptitle.text if t.legendgrouptitle and t.legendgrouptitle.text else "")
    rows, line_rows, used = 0, 0, 0
    for key, names in groups.items():
        w = max(_entry_width(n) for n in [*names, titles[key]])
        tall = len(names) + bool(titles[key])
        if used and used + w > LEGEND_WIDTH:
            rows, line_rows, used = rows + line_rows, 0, 0
        used, line_rows = used + w, max(line_rows, tall)
    return rows + line_rows


def spans_decades(values: Iterable[float | None], factor: float = 20.0) -> bool:
    """Whether the positive values span `factor` or more (then a log axis reads better than a linear one)."""
    pos = [v for v in values if isinstance(v, (int, float)) and v > 0 and math.isfinite(v)]
    return bool(pos) and max(pos) / min(pos) >= factor


def time_axis(seconds: Iterable[float | None]) -> tuple[str, float, bool]:
    """(unit, scale, log) for times given in seconds: "s" when any reaches 1 s, else "ms"; log when they span decades."""
    vals = [v for v in seconds if isinstance(v, (int, float)) and math.isfinite(v)]
    unit, scale = ("s", 1.0) if vals and max(vals) >= 1.0 else ("ms", 1e3)
    return unit, scale, spans_decades(vals)


def require_results(results: list[Result], what: str) -> list[Result]:
    results = list(results)
    if not results:
        raise ValueError(f"{what}: no Results to draw. Fix: pass the list bench.run returned or load_results(...).")
    return results


def _unique_labels(results: list[Result]) -> list[str]:
    """Result labels as bar categories; a repeated label gets ' #2', ' #3' so bars do not merge."""
    return _unique([r.label for r in results])


def step_labels(results: list[Result], mixed: bool | None = None) -> list[str]:
    """Bar categories: each run's step (RECORDED_MARK on recorded ones in a mixed figure), ' #2' on repeats."""
    mixed = is_mixed(results) if mixed is None else mixed
    return _unique([trace_name(r, mixed=mixed) for r in results])


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = defaultdict(int)
    out = []
    for label in labels:
        seen[label] += 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def batch_of(r: Result, keys: tuple[str, ...]) -> int | None:
    return next((r.config[k] for k in keys if isinstance(r.config.get(k), int)), None)


def _note(fig: go.Figure, text: str, y: float = 1.02) -> None:
    fig.add_annotation(text=text, xref="paper", yref="paper", x=0.5, y=y, showarrow=False,
                       font={"size": 11, "color": "gray"})


def _synthetic(rows: list[dict[str, Any]]) -> str:
    return synthetic_line(rows_synthetic(rows))


def rows_synthetic(rows: list[dict[str, Any]]) -> bool:
    return any(str(r.get("model", "")).startswith("synthetic:") for r in rows)
