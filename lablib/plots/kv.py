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
- `gpu_memory_utilization_figure`: what vLLM does with the fraction of the GPU it is given: KV
  capacity grows linearly with it, the peak follows the budget, and after each engine closes the GPU
  is back at its baseline, drawn in its own panel at its own scale (MiB beside 100 GiB peaks).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..mechanisms.kv import FragmentationReport
from ..mechanisms.paging import AllocatorSnapshot
from .style import rows_synthetic, colour, finish, rows_provenance

SIMULATED_KV = "simulated on this machine (lablib.mechanisms.kv, the workload's lengths: no engine ran)"
SIMULATED_PAGING = "simulated on this machine (lablib.mechanisms.paging: no engine ran)"
MIB, GIB = 2**20, 2**30


def fragmentation_bars(report: FragmentationReport | Sequence[dict[str, Any]]) -> go.Figure:
    """Used vs reserved-but-unused token slots per scheme, from `simulate_fragmentation` (or its rows())."""
    rows = report.rows() if isinstance(report, FragmentationReport) else list(report)
    needed = ("scheme", "reserved_tokens", "used_tokens", "waste_fraction", "max_concurrent")
    if not rows or any(k not in row for row in rows for k in needed):
        raise ValueError(f"fragmentation_bars: pass kv.simulate_fragmentation(...) or its rows(), each with {needed}.")
    schemes = [str(r["scheme"]) for r in rows]
    fig = go.Figure()
    used_name, waste_name = "holding real K/V", "reserved, never written (waste)"
    fig.add_bar(x=schemes, y=[r["used_tokens"] for r in rows], name=used_name, marker_color=colour(used_name),
                hovertemplate="%{x}: %{y} token slots used<extra></extra>")
    fig.add_bar(x=schemes, y=[r["reserved_tokens"] - r["used_tokens"] for r in rows],
                name=waste_name, marker_color=colour(waste_name),
                text=[f"{r['waste_fraction']:.0%} wasted<br>{r['max_concurrent']} requests fit" for r in rows],
                textposition="outside", cliponaxis=False, hovertemplate="%{x}: %{y} token slots wasted<extra></extra>")
    where = SIMULATED_KV
    if isinstance(report, FragmentationReport):
        reserve = f"{report.reservation} slots each" if report.reservation else "prompt + max_new_tokens each"
        where += (f"<br>budget {report.budget_tokens:,} token slots, blocks of {report.block_size}, "
                  f"contiguous reserves {reserve}, snapshot at {report.progress:.0%} of outputs")
    top = max(r["reserved_tokens"] for r in rows)
    fig.update_layout(barmode="stack", legend={"traceorder": "normal"})
    fig.update_yaxes(title_text="KV-cache token slots (tokens)", range=[0, top * 1.25])
    fig.update_xaxes(title_text="allocation scheme")
    return finish(fig, "KV cache: contiguous reservation vs paged blocks", where)


FREE = -1  # z of a free block: drawn blank (pale), so the pool's size stays visible
FREE_COLOUR = "#f2f2f2"
PALETTE = qualitative.Plotly + qualitative.D3 + qualitative.Set3  # owners' colours, reused past 32 requests


def _colourscale(n: int) -> list[list[Any]]:
    """A stepped scale: z = FREE pale, z = 0..n-1 one distinct colour each (zmin=-1.5, zmax=n-0.5)."""
    palette = [FREE_COLOUR] + [PALETTE[k % len(PALETTE)] for k in range(n)]
    scale = []
    for k, c in enumerate(palette):
        scale += [[k / (n + 1), c], [(k + 1) / (n + 1), c]]
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
    where = (f"{SIMULATED_PAGING}<br>{snapshot.allocated_blocks}/{total} blocks used by {len(rids)} requests, "
             f"{snapshot.waste_tokens} slots unfilled, {snapshot.waiting} waiting"
             + (f"; {'; '.join(events)}" if events else ""))
    fig.update_layout(plot_bgcolor="white")
    return finish(fig, f"Block pool at step {snapshot.step}: one cell per block, coloured by its request", where,
                  height=max(260, 40 * rows + 160))


def gpu_memory_utilization_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """KV capacity and peak GPU memory against gpu_memory_utilization, and the baseline before and after each engine.

    Three panels: KV-cache tokens (vLLM's report), the peak the engine held (GiB), and the device's memory in
    use before the engine started and after it closed (MiB, its own scale: beside a 100 GiB peak a 0.6 GiB
    baseline is invisible), with the rows' verdict on "back to baseline".
    """
    if not rows:
        raise ValueError("gpu_memory_utilization_figure: no rows. Fix: run lablib.experiments.sweeps.gpu_memory_utilization_rows().")
    g = [r["gpu_memory_utilization"] for r in rows]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.1,
                        subplot_titles=("KV-cache capacity", "peak during the run", "before start, after close"))
    fig.update_annotations(font_size=13)
    name = "KV-cache capacity"
    fig.add_trace(go.Scatter(x=g, y=[r["kv_tokens"] for r in rows], mode="lines+markers", name=name,
                             line={"color": colour(name)},
                             hovertemplate="gmu %{x}: %{y:,} KV tokens<extra></extra>"), 1, 1)
    name = "peak during run"
    fig.add_trace(go.Scatter(x=g, y=[_bytes(r.get("peak_used_bytes"), GIB) for r in rows], mode="lines+markers",
                             name=name, line={"color": colour(name)},
                             hovertemplate="gmu %{x}: peak %{y:.1f} GiB<extra></extra>"), 1, 2)
    before = [_bytes(r.get("vram_before_bytes"), MIB) for r in rows]
    after = [_bytes(r.get("vram_after_close_bytes"), MIB) for r in rows]
    for name, ys, marker in (("before engine start", before, {"symbol": "circle-open", "size": 14}),
                             ("after close", after, {"symbol": "x", "size": 8})):
        fig.add_trace(go.Scatter(x=g, y=ys, mode="markers", name=name, marker={**marker, "color": colour(name)},
                                 hovertemplate="gmu %{x}: %{y:,.1f} MiB " + name + "<extra></extra>"), 1, 3)
    known = [v for v in before + after if v is not None]
    if known:
        pad = max(64.0, 0.05 * max(known))
        fig.update_yaxes(range=[max(0.0, min(known) - pad), max(known) + pad], row=1, col=3)
    fig.add_annotation(text=_baseline_verdict(rows), xref="x3 domain", yref="y3 domain", x=0.5, y=0.04,
                       showarrow=False, font={"size": 11})
    fig.update_xaxes(title_text="gmu (fraction of the GPU)")
    fig.update_yaxes(title_text="KV capacity (tokens)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="peak used (GiB)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="GPU memory used (MiB)", row=1, col=3)
    return finish(fig, "gpu_memory_utilization (gmu) sweep: one engine per value", rows_provenance(rows),
                  synthetic=rows_synthetic(rows), height=440, legend_below=True)


def _bytes(v: Any, unit: int) -> float | None:
    return None if v is None else v / unit


def _baseline_verdict(rows: list[dict[str, Any]]) -> str:
    """"back to baseline after all 10 engines", or which engines were not (with the MiB they left behind)."""
    off = [r for r in rows if r.get("back_to_baseline") is False]
    unknown = [r for r in rows if r.get("back_to_baseline") is None]
    if off:
        return "NOT back to baseline:<br>" + "<br>".join(
            f"gmu={r['gpu_memory_utilization']} (+{((r.get('vram_after_close_bytes') or 0) - (r.get('vram_before_bytes') or 0)) / MIB:.0f} MiB)"
            for r in off)
    if unknown and len(unknown) == len(rows):
        return "baseline not measured (no NVML)"
    return f"back to baseline<br>after all {len(rows) - len(unknown)} engines"
