"""KV-cache pictures: how much reserved memory holds real tokens, and what a block pool looks like.

Two views of why vLLM pages its KV cache (the arithmetic is `lablib.mechanisms.kv`, the block
pool `lablib.mechanisms.paging`):

- `fragmentation_bars`: per allocation scheme, the token slots that hold real K/V against
  the slots reserved and never written. Contiguous reservation for the worst case wastes
  most of the memory; paged blocks waste only each request's unfilled last block, and the
  freed memory becomes more requests running at once.
- `block_table_heatmap`: one AllocatorSnapshot of the block pool, one cell per physical
  block coloured by the request that owns it, free blocks blank. A request's blocks need
  not be neighbours: the block table maps them, like virtual memory pages.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from plotly.colors import qualitative

from ..mechanisms.kv import FragmentationReport
from ..mechanisms.paging import AllocatorSnapshot
from .style import _synthetic


def fragmentation_bars(report: FragmentationReport | Sequence[dict[str, Any]]) -> go.Figure:
    """Used vs reserved-but-unused token slots per scheme, from `simulate_fragmentation` (or its rows())."""
    rows = report.rows() if isinstance(report, FragmentationReport) else list(report)
    needed = ("scheme", "reserved_tokens", "used_tokens", "waste_fraction", "max_concurrent")
    if not rows or any(k not in row for row in rows for k in needed):
        raise ValueError(f"fragmentation_bars: pass kv.simulate_fragmentation(...) or its rows(), each with {needed}.")
    schemes = [str(r["scheme"]) for r in rows]
    fig = go.Figure()
    fig.add_bar(x=schemes, y=[r["used_tokens"] for r in rows], name="holding real K/V", marker_color="#00cc96",
                hovertemplate="%{x}: %{y} token slots used<extra></extra>")
    fig.add_bar(x=schemes, y=[r["reserved_tokens"] - r["used_tokens"] for r in rows],
                name="reserved, never written (waste)", marker_color="#ef553b",
                text=[f"{r['waste_fraction']:.0%} wasted<br>{r['max_concurrent']} requests fit" for r in rows],
                textposition="outside", hovertemplate="%{x}: %{y} token slots wasted<extra></extra>")
    title = "KV cache: contiguous reservation vs paged blocks"
    if isinstance(report, FragmentationReport):
        reserve = f"{report.reservation} slots each" if report.reservation else "prompt + max_new_tokens each"
        title += (f"<br><sup>budget {report.budget_tokens} token slots, blocks of {report.block_size}, "
                  f"contiguous reserves {reserve}, snapshot at {report.progress:.0%} of outputs</sup>")
    fig.update_layout(barmode="stack", title=title, yaxis_title="token slots", legend={"traceorder": "normal"})
    return fig


FREE = -1  # z of a free block: drawn blank (pale), so the pool's size stays visible
FREE_COLOUR = "#f2f2f2"
PALETTE = qualitative.Plotly + qualitative.D3 + qualitative.Set3  # owners' colours, reused past 32 requests


def _colourscale(n: int) -> list[list[Any]]:
    """A stepped scale: z = FREE pale, z = 0..n-1 one distinct colour each (zmin=-1.5, zmax=n-0.5)."""
    palette = [FREE_COLOUR] + [PALETTE[k % len(PALETTE)] for k in range(n)]
    scale = []
    for k, colour in enumerate(palette):
        scale += [[k / (n + 1), colour], [(k + 1) / (n + 1), colour]]
    return scale


def block_table_heatmap(snapshot: AllocatorSnapshot, columns: int | None = None) -> go.Figure:
    """The block pool of one snapshot: a cell per physical block, coloured by owner, free cells blank.

    z holds the owner's colour index (FREE for a free block, None past the pool's end); the
    cell text is the owning request id, empty for a free block.
    """
    if not isinstance(snapshot, AllocatorSnapshot):
        raise ValueError("block_table_heatmap: pass one AllocatorSnapshot, e.g. paging.replay_block_allocation(...)[step].")
    total = snapshot.total_blocks
    cols = columns or min(total, max(8, math.ceil(math.sqrt(total * 2))))
    rows = math.ceil(total / cols)
    owner: dict[int, tuple[int, int]] = {}  # physical block -> (request id, logical index)
    for rid, table in snapshot.block_tables.items():
        for logical, phys in enumerate(table):
            owner[phys] = (rid, logical)
    rids = sorted(snapshot.block_tables)
    colour_of = {rid: k for k, rid in enumerate(rids)}
    z: list[list[float | None]] = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [["" for _ in range(cols)] for _ in range(rows)]
    bs = snapshot.block_size
    for phys in range(total):
        r, c = divmod(phys, cols)
        if phys in owner:
            rid, logical = owner[phys]
            filled = min(bs, snapshot.tokens[rid] - logical * bs)
            z[r][c], text[r][c] = colour_of[rid], str(rid)
            hover[r][c] = f"block {phys}: request {rid}, logical block {logical}, {filled}/{bs} tokens"
        else:
            z[r][c], hover[r][c] = FREE, f"block {phys}: free"
    fig = go.Figure(go.Heatmap(
        z=z, text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text", showscale=False,
        colorscale=_colourscale(len(rids)), zmin=FREE - 0.5, zmax=max(len(rids), 1) - 0.5,
        xgap=2, ygap=2, name="blocks"))
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed")
    events = [f"{name} {list(ids)}" for name, ids in (("admitted", snapshot.admitted), ("finished", snapshot.finished),
                                                      ("preempted", snapshot.preempted)) if ids]
    fig.update_layout(
        title=(f"Block pool at step {snapshot.step}: {snapshot.allocated_blocks}/{total} blocks used by "
               f"{len(rids)} requests, {snapshot.waste_tokens} slots unfilled, {snapshot.waiting} waiting"
               + (f"<br><sup>{'; '.join(events)}</sup>" if events else "")),
        height=max(250, 40 * rows + 140), plot_bgcolor="white")
    return fig


def gpu_memory_utilization_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """KV capacity vs gpu_memory_utilization, and VRAM before start / after close of each engine."""
    if not rows:
        raise ValueError("gpu_memory_utilization_figure: no rows. Fix: run lablib.experiments.sweeps.gpu_memory_utilization_rows().")
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
