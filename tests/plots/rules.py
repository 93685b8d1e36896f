"""The figure rules' instruments, shared by every test under tests/plots/ (test_rules.py states the rules).

What can be checked on a plotly figure without a browser, read from its traces and layout: the legend's
entries and each trace's colour, every axis a visible trace draws on and whether it shows numbers, the
texts that state where the data come from (title and annotations), and whether values span decades.
Each lab's figure tests (test_attention.py, test_parallel.py, ...) apply the same rules with these.
"""
from __future__ import annotations

import inspect
import math
import re
from collections import defaultdict
from collections.abc import Callable
from types import ModuleType

import plotly.graph_objects as go

from lablib.plots import style

PROVENANCE = re.compile(r"recorded|\blive\b|measured|simulated|synthetic weights", re.IGNORECASE)
UNIT = re.compile(r"\(.+\)|\[.+\]")
# a text that says where a figure's data come from ("simulator: ..." labels what lab 04's simulator drew, as lab 05's
# capacity search on a machine without vLLM)
STATES = re.compile(r"recorded on|live on|simulated|simulator:")
STATES_OR_NOT_YET = re.compile(r"recorded on|live on|simulated|simulator:|not recorded yet")  # ... or nothing is yet


def builders(module: ModuleType) -> set[str]:
    """The public functions `module` defines that return a figure (by their return annotation)."""
    return {name for name, fn in inspect.getmembers(module, inspect.isfunction)
            if fn.__module__ == module.__name__ and not name.startswith("_")
            and "Figure" in str(inspect.signature(fn).return_annotation)}


def legend(fig: go.Figure) -> list:
    """The traces listed in the legend (a heatmap's colour bar aside)."""
    return [t for t in fig.data if t.showlegend is not False and t.type != "heatmap" and t.name]


def trace_colour(t) -> str | None:
    """A trace's own colour (its line's, else its markers'); None when plotly picks it by the order of traces."""
    for c in (getattr(getattr(t, "line", None), "color", None), getattr(getattr(t, "marker", None), "color", None)):
        if isinstance(c, str):
            return c
    return None


def check_legend(key: str, fig: go.Figure) -> None:
    """No legend name repeats, and every legend entry has a colour of its own."""
    names = [t.name for t in legend(fig)]
    assert len(names) == len(set(names)), f"{key}: a legend name repeats: {names}"
    uncoloured = [t.name for t in legend(fig) if trace_colour(t) is None]
    assert not uncoloured, f"{key}: traces coloured by the order they were added: {uncoloured}"


def colour_clashes(figures: dict[str, go.Figure], name: Callable[[str], str] = str) -> dict[str, list]:
    """Names drawn in more than one colour across the figures, each with its (colour, figure) pairs.

    `name` reads a trace's name as the legend means it (style.base_name drops the recorded mark); traces with
    no name or no colour of their own, and heatmaps, are not counted."""
    seen = defaultdict(set)
    for key, fig in figures.items():
        for t in fig.data:
            c = trace_colour(t)
            if c is not None and t.name and t.type != "heatmap":
                seen[name(t.name)].add((c, key))
    return {n: sorted(v) for n, v in seen.items() if len({c for c, _ in v}) > 1}


def axes(fig: go.Figure):
    """(layout name, axis, values) of every axis a visible trace draws on."""
    used = defaultdict(list)
    for t in fig.data:
        for letter in "xy":
            ref = getattr(t, f"{letter}axis", None) or letter
            values = getattr(t, letter, None)
            used[f"{letter}axis{ref[1:]}"].extend(list(values) if values is not None else [])
    for name, values in used.items():
        yield name, fig.layout[name], values


def numeric(axis, values) -> bool:
    """Whether the axis shows numbers (not categories, tick labels shown)."""
    if axis.type == "category" or axis.showticklabels is False:
        return False
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) or not values


def positive(values) -> list[float]:
    """The finite positive numbers among an axis's values (what a log axis can show)."""
    return [v for v in values if isinstance(v, (int, float)) and v > 0 and math.isfinite(v)]


def spans_decades(values) -> bool:
    """Whether the positive values span three decades or more: a linear axis would flatten them."""
    pos = positive(values)
    return bool(pos) and max(pos) / min(pos) >= 1000


def texts(fig: go.Figure) -> list[str]:
    """The figure's title and every annotation's text."""
    return [fig.layout.title.text or ""] + [a.text or "" for a in fig.layout.annotations]


def stating(fig: go.Figure, states: re.Pattern = STATES) -> list[str]:
    """The title and annotations that state where the figure's data come from."""
    return [t for t in texts(fig) if states.search(t)]


def vertical_joins(fig: go.Figure) -> list[str]:
    """Line traces that join two points at the same x: runs of different series drawn as one line, straight up."""
    out = []
    for t in fig.data:
        if t.type == "scatter" and "lines" in (t.mode or "lines") and t.x is not None:
            xs = [x for x in t.x if x is not None]
            if len(xs) != len(set(xs)):
                out.append(t.name)
    return out


def shared_colours(fig: go.Figure, name: Callable[[str], str] = str) -> dict[str, list[str]]:
    """Legend entries of different names (as `name` reads them) drawn in the same colour, by colour."""
    by_colour = defaultdict(set)
    for t in legend(fig):
        c = trace_colour(t)
        if c is not None:
            by_colour[c].add(name(t.name))
    return {c: sorted(n) for c, n in by_colour.items() if len(n) > 1}


def unfit_text(fig: go.Figure) -> list[str]:
    """What would run off a notebook's figure or into a neighbour on a 1,024 px page, as far as the layout tells:
    a line of the title's provenance (its `<sup>` lines) longer than style.PROVENANCE_CHARS, and a line of an axis
    title wider than its axis (style.AXIS_TITLE_PX a character against style.axis_px). [] when everything fits."""
    title = fig.layout.title.text or ""
    unfit = [f"provenance line of {len(line)} characters: {line[:60]}..."
             for line in re.findall(r"<sup>(.*?)</sup>", title) for line in line.split("<br>")
             if "<" not in line and len(line) > style.PROVENANCE_CHARS]
    for name in fig.layout:
        if re.fullmatch(r"[xy]axis\d*", name) and fig.layout[name].title.text:
            room = style.axis_px(fig, [name])
            unfit += [f"{name} title line '{line}' ({len(line) * style.AXIS_TITLE_PX:.0f} px) on {room:.0f} px"
                      for line in fig.layout[name].title.text.split("<br>")
                      if "<" not in line and len(line) * style.AXIS_TITLE_PX > room]
    return unfit
