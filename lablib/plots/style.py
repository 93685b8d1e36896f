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
    if name.startswith("hf-continuous"):  # transformers' continuous batching: one colour, apart from the static ramp
        return "#66a61e"
    if re.match(r"hf-(naive|static)(-b\d+)?-compile\b", name):  # static cache + torch.compile: apart from both
        return "#e6ab02"
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
           height: int | None = None, legend_below: bool = False, legend_width: int | None = None) -> go.Figure:
    """Title with the provenance as its second line (unless `title` already says it), notes under the plot,
    margins that grow to fit tick labels and titles. `legend_width`: where a legend below wraps (px), for a plot
    narrower than most. Returns fig.

    Nothing runs off the figure or into its neighbour at 1,024 px: the title and a long provenance wrap at spaces
    (every word kept, in order: `shown_text` reads them back whole); an axis title longer than its axis wraps
    (`wrap_axis_titles`); notes sit under the x axes' titles and tick labels, however many lines those take; and
    the plot keeps at least MIN_PLOT_PX of height whatever the margins hold."""
    lines = [] if PROVENANCE_WORDS.search(title) or not where else provenance_lines(where)
    head = wrap_title(title)
    text = head + "".join(f"<br><sup>{line}</sup>" for line in lines) + synthetic_line(
        synthetic and SYNTHETIC_LABEL not in title)
    n_lines = text.count("<br>")
    if legend_below:  # a wide legend under the plot, so the plots keep the full width
        fig.update_layout(legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 0.01, "yanchor": "bottom",
                                  "yref": "container"})
    wrap_axis_titles(fig, "x")  # the legend placed first: one at the right takes its width from the x axes
    under = x_axis_depth(fig)  # px the x axes' tick labels and titles take beyond one line each
    wrapped = [line for note in notes for line in wrap(note)]  # a long note wraps, never runs off the figure's edge
    for i, note in enumerate(wrapped):  # under the x axis' title, one line each
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, xanchor="left", y=0, yanchor="top",
                           yshift=-64 - under - 18 * i, showarrow=False, align="left", font={"size": 11, "color": "gray"})
    subplot_titles = any(a.yref == "paper" and a.y is not None and a.y >= 1 and a.yanchor == "bottom"
                         for a in fig.layout.annotations)  # make_subplots' titles sit in the top margin too
    legend = 24 * legend_rows(fig, legend_width or LEGEND_WIDTH) + 16 if legend_below else 0
    bottom = (80 + 18 * len(wrapped) if wrapped else 60) + under + legend
    top = 62 + 22 * n_lines + (30 if subplot_titles else 0)
    # the title hangs from the top; the margin holds all its lines, and the subplot titles below them
    fig.update_layout(title={"text": text, "x": 0.01, "xanchor": "left", "y": 1, "yref": "container",
                             "yanchor": "top", "pad": {"t": 26}},
                      margin={"t": top, "b": bottom}, showlegend=True)
    if height is not None:  # a title wrapped to more lines takes its room from the margin, not from the plots
        added = head.count("<br>") - title.count("<br>") + max(0, len(lines) - 1)
        fig.update_layout(height=height + 24 * added)
    if (fig.layout.height or DEFAULT_HEIGHT) - top - bottom < MIN_PLOT_PX:  # notes and legend never squash the plot
        fig.update_layout(height=top + bottom + MIN_PLOT_PX)
    wrap_axis_titles(fig, "y")  # now that the margins, so the axes' lengths, are known
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    log_axis_ticks(fig)
    return fig


TITLE_CHARS = 65  # a title's line at 17 px that ends left of plotly's mode bar (top right) on a 1,024 px page
NOTE_CHARS = 120  # a note's line at 11 px fits a 1,024 px page's plot width in about this many characters
PROVENANCE_CHARS = 125  # a provenance line (the title's <sup>, about 12 px) fits a notebook's 880 px figure
AXIS_TITLE_PX = 7.5  # px a character of an axis title (14 px) takes, about
TICK_PX = 7  # px a character of a tick label (12 px) takes, about
MIN_PLOT_PX = 200  # the least height the plots keep, whatever the title, notes and legend take
DEFAULT_HEIGHT = 450  # plotly's figure height when a figure sets none
LEGEND_WIDTH = 800  # px a horizontal legend has at 1,024 px before it wraps to another row


def wrap(note: str, width: int = NOTE_CHARS) -> list[str]:
    """A note in lines of at most `width` characters, broken at spaces only: never inside a word, a hyphenated name
    (`w8a8-int8`, `--steps`) or a path, so the lines joined by spaces are the note again. A word longer than
    `width` keeps a line of its own."""
    return textwrap.wrap(note, width, break_long_words=False, break_on_hyphens=False) or [note]


def provenance_lines(where: str, width: int = PROVENANCE_CHARS) -> list[str]:
    """A provenance in lines that fit the figure: its own line breaks kept, then its clauses (split at "; ") packed
    whole into lines of at most `width` characters; only a clause longer than a line is broken, at spaces. A part
    with markup of its own stays whole."""
    out: list[str] = []
    for part in where.split("<br>"):
        if "<" in part or len(part) <= width:
            out.append(part)
            continue
        line = ""
        for clause in re.split(r"(?<=;) ", part):
            if line and len(line) + 1 + len(clause) <= width:
                line += " " + clause
                continue
            if line:
                out.append(line)
            *full, line = wrap(clause, width)
            out += full
        out.append(line)
    return out


def shown_text(text: str) -> str:
    """Plotly text as a reader sees it: line breaks and markup (`<br>`, `<sup>`) as spaces, runs of spaces as one.
    A sentence wrapped by `wrap`, `wrap_title` or `wrap_axis_titles` reads back whole from it."""
    return " ".join(re.sub(r"<[^>]*>", " ", text).split())


def wrap_title(title: str, width: int = TITLE_CHARS) -> str:
    """The title's first line broken at spaces into lines of at most `width` characters, so it runs under neither
    the mode bar nor the figure's edge; a line with markup, or a phrase saying where data come from, stays whole."""
    first, sep, rest = title.partition("<br>")
    return "<br>".join(balanced_lines(first, width)) + sep + rest


def balanced_lines(text: str, width: int) -> list[str]:
    """`text` in the fewest lines of at most `width` characters, of about equal length (no lone word on the last),
    broken at spaces but never inside "recorded on" or "live on"; text with markup stays whole."""
    if len(text) <= width or "<" in text:
        return [text]
    keep = PROVENANCE_WORDS.sub(lambda m: m.group(0).replace(" ", "\0"), text)
    lines = wrap(keep, width)
    even = math.ceil(len(keep) / len(lines))
    while len(balanced := wrap(keep, even)) > len(lines):
        even += 1
    return [line.replace("\0", " ") for line in balanced]


def legend_rows(fig: go.Figure, width: int = LEGEND_WIDTH) -> int:
    """About how many rows a horizontal legend of this figure takes at 1,024 px (its entries' text, 7 px a
    character, plus the symbol; wrapped at `width` px): what the bottom margin must hold so the legend does not
    climb into the notes.

    A legend of titled groups (`legendgrouptitle`) lays each group out as a column, its title over its entries,
    and puts the columns side by side while they fit: its rows are, per line of columns, the tallest column's."""
    shown = [t for t in fig.data if t.showlegend is not False and t.name]
    if not shown:
        return 0
    if any(t.legendgrouptitle and t.legendgrouptitle.text for t in shown):
        return _grouped_legend_rows(shown, width)
    rows, used = 1, 0
    for name in dict.fromkeys(t.name for t in shown):
        w = _entry_width(name)
        if used and used + w > width:
            rows, used = rows + 1, 0
        used += w
    return rows


def _entry_width(text: str) -> int:
    return 50 + 7 * len(re.sub(r"<[^>]+>", "", text))


def _grouped_legend_rows(traces: list, width: int) -> int:
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
        if used and used + w > width:
            rows, line_rows, used = rows + line_rows, 0, 0
        used, line_rows = used + w, max(line_rows, tall)
    return rows + line_rows


def wrap_axis_titles(fig: go.Figure, letter: str) -> None:
    """Break each `letter` ("x" or "y") axis title longer than its axis (on a 1,024 px page, `axis_px`) into balanced
    lines at spaces: a y title no taller than its panel (so it does not climb into the provenance line above), an x
    title no wider than its panel (so side-by-side panels' titles do not run into each other). A title with markup
    of its own is left as it is."""
    for name in fig.layout:
        if not re.fullmatch(rf"{letter}axis\d*", name):
            continue
        text = fig.layout[name].title.text
        if not text or "<" in text:
            continue
        width = max(10, int(axis_px(fig, [name]) / AXIS_TITLE_PX))
        if len(text) > width:
            fig.layout[name].title.text = "<br>".join(balanced_lines(text, width))


def x_axis_depth(fig: go.Figure) -> int:
    """About how many px the x axes' tick labels and titles reach below the plot beyond one line each: a title's
    extra lines, and category labels that plotly tilts (30 degrees) when they do not fit side by side. What notes
    under the plot are shifted down by, so they never sit on an axis title."""
    depth = 0
    for name in fig.layout:
        axis = fig.layout[name] if re.fullmatch(r"xaxis\d*", name) else None
        if axis is None:
            continue
        lines = (axis.title.text or "").count("<br>")
        ref = "x" + name[5:]
        labels = {str(v) for t in fig.data if (getattr(t, "xaxis", None) or "x") == ref
                  for v in (getattr(t, "x", None) if getattr(t, "x", None) is not None else ())
                  if isinstance(v, str)}
        tilt = 0
        if labels and axis.showticklabels is not False:
            widest = TICK_PX * max(len(v) for v in labels)
            if (axis.tickangle not in (None, 0, "auto") or
                    len(labels) * (widest + 8) > axis_px(fig, [name])):
                tilt = max(0, round(widest / 2) - 6)  # sin 30 degrees of the widest label, less the line it had
        depth = max(depth, 18 * lines + tilt)
    return depth


LABEL_GAP = 12  # px between two tick labels of a log axis, at the least


def log_ticks(lo: float, hi: float, length: float, vertical: bool = False) -> tuple[list[float], list[str]]:
    """Tick values and labels for a log axis `length` px long showing lo to hi (both > 0): 1, 2 and 5 of each
    decade where their labels fit side by side, else the decades alone (every other, ... as room asks); within a
    decade, evenly spaced values where 1-2-5 shows fewer than three. Values beyond the range are kept: plotly draws
    only those shown."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decade = length / max(math.log10(hi / lo), 0.1)  # px per decade
    short = hi / lo < 10

    def ticks(digits: tuple[int, ...], every: int = 1) -> list[float]:
        return [float(f"{d}e{e}") for e in range(first, last + 1) if (e - first) % every == 0 for d in digits]

    def fits(vals: list[float]) -> bool:  # the closest two labels do not touch
        widest = 12 if vertical else max(7 * len(_tick_text(v)) for v in vals)
        return min(math.log10(b / a) for a, b in zip(vals, vals[1:])) * decade >= widest + LABEL_GAP

    def shown(vals: list[float]) -> int:
        return sum(lo / 1.0001 <= v <= hi * 1.0001 for v in vals)

    if short and not (shown(ticks((1, 2, 5))) >= 3 and fits(ticks((1, 2, 5)))):
        return _short_log_ticks(lo, hi, decade, vertical)  # evenly spaced, as plotly draws a short log axis
    if fits(ticks((1, 2, 5))):
        vals = ticks((1, 2, 5))
    else:
        every = 1
        while not fits(ticks((1,), every)) and every < last - first:
            every += 1
        vals = ticks((1,), every)
    return vals, [_tick_text(v) for v in vals]


def _short_log_ticks(lo: float, hi: float, decade: float, vertical: bool) -> tuple[list[float], list[str]]:
    """Multiples of the finest step of 1, 2, 2.5 or 5 times a power of ten whose labels fit (the closest two,
    at the top, do not touch): 60, 80, ..., 240 on an axis from 64 to 256."""
    for k in range(math.floor(math.log10(hi - lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 2.5, 5):
            step = m * 10.0 ** k
            vals = [round(i * step, 12) for i in range(max(1, math.floor(lo / step)), math.ceil(hi / step) + 1)]
            shown = [v for v in vals if lo / 1.0001 <= v <= hi * 1.0001]
            widest = 12 if vertical else max(7 * len(_tick_text(v)) for v in vals)
            if len(shown) >= 2 and math.log10(shown[-1] / shown[-2]) * decade >= widest + LABEL_GAP:
                return vals, [_tick_text(v) for v in vals]
    return [lo, hi], [_tick_text(lo), _tick_text(hi)]


def _tick_text(v: float) -> str:
    """1k, 2M, 0.5, 0.002, 100µ: SI prefixes beyond a thousand and under a thousandth, as plotly writes them."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1e-3, ""), (1e-6, "µ"), (1e-9, "n")):
        if v >= scale * 0.9999:
            return f"{v / scale:g}{prefix}" if prefix else f"{v:g}"
    return f"{v:g}"


def log_axis_ticks(fig: go.Figure) -> None:
    """Label every log axis of fig that has no ticks of its own at 1-2-5, decades or even steps (`log_ticks`, for
    the axis's length on a 1,024 px page), in the axis's font: not plotly's small 2s and 5s (or every digit) crowding
    between the decades. Faint minor grid lines mark the digits between. Axes that match another share its ticks;
    an axis whose values span less than a factor of two keeps plotly's ticks."""
    values: dict[str, list[float]] = defaultdict(list)
    for t in fig.data:
        for letter in "xy":
            ref = getattr(t, f"{letter}axis", None) or letter
            vals = getattr(t, letter, None)
            values[_axis_name(ref)] += [v for v in (vals if vals is not None else ())
                                        if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for shape in fig.layout.shapes:
        for letter in "xy":
            ref = (shape[f"{letter}ref"] or letter).split(" ")[0]
            if ref != "paper":
                values[_axis_name(ref)] += [v for v in (shape[f"{letter}0"], shape[f"{letter}1"])
                                            if isinstance(v, (int, float))]
    groups: dict[str, list[str]] = defaultdict(list)  # matched axes: one set of ticks
    for name in fig.layout:
        axis = fig.layout[name] if re.fullmatch(r"[xy]axis\d*", name) else None
        if axis is not None and axis.type == "log" and axis.tickvals is None and axis.dtick is None:
            groups[_axis_name(axis.matches) if axis.matches else name].append(name)
    for key, names in groups.items():
        pos = [v for n in {key, *names} for v in values.get(n, ()) if v > 0 and math.isfinite(v)]
        ranges = [fig.layout[n].range for n in names if fig.layout[n].range is not None]
        if ranges:  # a log axis's range is in decades
            pos = [10 ** r for r in ranges[0] if isinstance(r, (int, float))] or pos
        if not pos or max(pos) / min(pos) < 2:  # a short axis: plotly's own ticks, evenly spaced
            continue
        length = axis_px(fig, names)
        vals, text = log_ticks(min(pos), max(pos), length, vertical=key[0] == "y")
        decade = length / math.log10(max(pos) / min(pos))  # px
        digits = range(1, 10) if decade >= 60 else (1, 2, 5) if decade >= 30 else (1,)  # faint, never a smear
        if max(pos) / min(pos) < 10:
            digits = ()  # evenly spaced ticks: their grid is enough
        decades = range(round(math.log10(min(vals))), round(math.log10(max(vals))) + 1)
        minor = [float(f"{d}e{e}") for e in decades for d in digits if float(f"{d}e{e}") not in vals]
        for n in names:
            fig.layout[n].update(tickmode="array", tickvals=vals, ticktext=text,
                                 minor={"tickmode": "array", "tickvals": minor, "ticks": "", "showgrid": True})


PAGE_PX = 880  # a figure's width in a notebook on a 1,024 px page
SIDE_LEGEND_PX = 180  # about what a legend at the plot's right takes from it


def axis_px(fig: go.Figure, names: list[str]) -> float:
    """About how long the axes `names` are on a 1,024 px page: the figure less its margins (and a legend at the
    right), times the axis's share of the plot (its domain)."""
    m, side = fig.layout.margin, fig.layout.showlegend is not False and fig.layout.legend.orientation != "h"
    if names[0][0] == "x":
        whole = (fig.layout.width or PAGE_PX) - (m.l or 80) - (m.r or 80) - (SIDE_LEGEND_PX if side else 0)
    else:
        whole = (fig.layout.height or 450) - (m.t or 100) - (m.b or 80)
    domain = max((d[1] - d[0]) if (d := fig.layout[n].domain) else 1.0 for n in names)
    return max(whole, 60) * domain


def _axis_name(ref: str) -> str:
    """'x2' -> 'xaxis2', 'y' -> 'yaxis'."""
    return ref[0] + "axis" + ref[1:]


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
