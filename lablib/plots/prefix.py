"""Prefix-caching pictures: KV blocks shared and evicted, hits against the shared prefix, and what caching buys.

The simulator's views (`lablib.mechanisms.prefix`, fed the embedded tokenizer's token ids):

- `block_states`: every physical block at every scheduler step, coloured free, cached (free but its
  hash kept, so a later request can hit it), in use, or shared by two requests or more; under it the
  hashes evicted each step. A small pool shows LRU at work: a popular prefix stays cached, a rare
  one loses blocks before it comes back.
- `hit_rate_vs_prefix`: hit rate against the shared-prefix length, beside the most a cache of whole
  blocks could give, and the tokens each later request finds cached against its shared prompt
  (whole blocks only: a 200-token prefix yields 192).
- `cached_per_request`: the usual advice, request by request: the shared part first, after a
  per-request line, a multi-turn chat.
- `scarce_memory`: hit rate and evictions against the cache's capacity, per arrival order.

vLLM's view (`on_off_figure`): TTFT p50 with prefix caching on and off against the shared-prefix
length, and the hit rate vLLM's own counters report. On a server under Poisson load (`serve_figure`): the hit
rate from `/metrics` beside the simulator's for the same requests, and TTFT p50 and p99, against the rate.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..mechanisms.prefix import PrefixCacheResult
from ..session import Shown
from .style import colour, finish, time_axis

SIMULATED = "simulated on this machine (lablib.mechanisms.prefix on the embedded tokenizer's token ids: no engine ran)"
# a block's state in block_states: (name in the legend, colour); z is the index
STATES = (("free", "#f2f2f2"), ("cached (free, hash kept)", "#9ecae1"), ("in use by one request", "#fdae6b"),
          ("shared by 2+ requests", "#d94801"))
EVICTED = "hashes evicted"
ON, OFF = "prefix caching on", "prefix caching off"


def _states_scale() -> list[list[Any]]:
    n, scale = len(STATES), []
    for k, (_, c) in enumerate(STATES):
        scale += [[k / n, c], [(k + 1) / n, c]]
    return scale


def block_states(result: PrefixCacheResult) -> go.Figure:
    """Every block at every step of `simulate(...)` (kept snapshots), coloured by state; evictions under it."""
    if not isinstance(result, PrefixCacheResult) or not result.snapshots:
        raise ValueError("block_states: pass a PrefixCacheResult with snapshots, e.g. mechanisms.prefix.simulate(...) "
                         "with keep_snapshots=True (the default).")
    snaps, blocks = result.snapshots, list(range(result.num_blocks))
    steps = [s.step for s in snaps]
    holders: list[dict[int, list[int]]] = []
    for s in snaps:
        held: dict[int, list[int]] = {}
        for rid, table in s.block_tables.items():
            for b in table:
                held.setdefault(b, []).append(rid)
        holders.append(held)
    z = [[0] * len(snaps) for _ in blocks]
    text = [[""] * len(snaps) for _ in blocks]
    hover = [[""] * len(snaps) for _ in blocks]
    for j, s in enumerate(snaps):
        for b, state in enumerate(s.states()):
            k = {"free": 0, "cached": 1}.get(state, 2 if s.ref_counts[b] == 1 else 3)
            z[b][j] = k
            rids = holders[j].get(b, [])
            text[b][j] = ",".join(map(str, rids))
            hover[b][j] = f"step {s.step}, block {b}: {STATES[k][0]}" + (f", requests {rids}" if rids else "")
    fig = make_subplots(rows=2, cols=1, row_heights=[0.8, 0.2], vertical_spacing=0.06)
    fig.add_trace(go.Heatmap(x=steps, y=blocks, z=z, text=text, texttemplate="%{text}", hovertext=hover,
                             hoverinfo="text", colorscale=_states_scale(), zmin=-0.5, zmax=len(STATES) - 0.5,
                             showscale=False, xgap=1, ygap=1, name="blocks"), 1, 1)
    for name, c in STATES:  # legend entries for the heatmap's colours
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker={"symbol": "square", "size": 12, "color": c}), 1, 1)
    evicted = [s.evictions - (snaps[j - 1].evictions if j else 0) for j, s in enumerate(snaps)]
    fig.add_trace(go.Bar(x=steps, y=evicted, name=EVICTED, marker_color=colour(EVICTED),
                         hovertemplate="step %{x}: %{y} hashes evicted<extra></extra>"), 2, 1)
    fig.update_xaxes(showticklabels=False, row=1, col=1)
    fig.update_xaxes(title_text="scheduler step (steps)", row=2, col=1)
    fig.update_yaxes(title_text="physical block (id)", autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text="evicted (blocks)", rangemode="tozero", row=2, col=1)
    fig.update_layout(plot_bgcolor="white")
    admitted = [f"r{rid}: {result.cached_tokens[rid]}" for s in snaps for rid in s.admitted]
    notes = [f"cached tokens per request as it was admitted: {', '.join(admitted)}",
             f"{result.evictions} hashes evicted in all; a cell's text names the requests holding that block"]
    return finish(fig, f"KV blocks over time: {result.num_blocks} blocks of {result.block_size} tokens, "
                       f"{result.concurrency} requests at a time", SIMULATED, notes=notes,
                  height=max(420, 22 * result.num_blocks + 260))


def hit_rate_vs_prefix(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """The simulator's hit rate against the shared-prefix length, and each later request's cached tokens.

    `rows` from `experiments.prefix.prefix_length_rows`."""
    rows = sorted(rows, key=lambda r: r["shared_tokens"])
    if not rows:
        raise ValueError("hit_rate_vs_prefix: no rows. Fix: pass experiments.prefix.prefix_length_rows(engine).")
    x = [r["shared_tokens"] for r in rows]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("hit rate over the set", "cached per later request"))
    for name, key, dash in (("hit rate", "hit_rate", "solid"), ("if every shared token hit", "best_hit_rate", "dash")):
        fig.add_trace(go.Scatter(x=x, y=[100 * r[key] for r in rows], mode="lines+markers", name=name,
                                 line={"color": colour(name), "dash": dash},
                                 hovertemplate="%{x} shared tokens: %{y:.1f}%<extra>" + name + "</extra>"), 1, 1)
    name = "shared prefix"
    fig.add_trace(go.Scatter(x=x, y=x, mode="lines", name=name, line={"color": colour(name), "dash": "dot"}), 1, 2)
    name = "cached per later request"
    fig.add_trace(go.Scatter(x=x, y=[r["cached_per_later_request"] for r in rows], mode="markers+text", name=name,
                             marker={"color": colour(name), "size": 10},
                             text=[f"{r['cached_per_later_request']} of {r['shared_tokens']}" for r in rows],
                             textposition=_label_sides(x), cliponaxis=False,
                             hovertemplate="%{x} shared: %{y} cached<extra></extra>"), 1, 2)
    fig.update_xaxes(title_text="shared prefix (tokens)")
    fig.update_yaxes(title_text="hit rate (% of prompt)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="cached tokens per request (tokens)", rangemode="tozero", row=1, col=2)
    sets = ", ".join(f"{r['workload']} ({r['requests']} requests)" for r in rows)
    return finish(fig, "Hit rate against the shared-prefix length (whole 16-token blocks only)", SIMULATED,
                  notes=[sets, ("the first request of a set computes everything; each later one hits the shared "
                                "prompt's full blocks")], legend_below=True, height=460)


def _label_sides(x: Sequence[float]) -> list[str]:
    """Where each point's label goes: below right, or above left when the point before is close (within 15% of the
    axis), so two neighbours' labels do not overlap."""
    near = 0.15 * (max(x) - min(x))
    return ["top left" if i and x[i] - x[i - 1] < near else "bottom right" for i in range(len(x))]


def cached_per_request(results: Mapping[str, PrefixCacheResult]) -> go.Figure:
    """Cached tokens per request in the order sent, one line per variant (`experiments.prefix.advice`)."""
    if not results:
        raise ValueError("cached_per_request: pass {name: PrefixCacheResult}, e.g. experiments.prefix.advice(engine).")
    fig = go.Figure()
    notes = []
    for name, res in results.items():
        n = list(range(1, len(res.cached_tokens) + 1))
        fig.add_trace(go.Scatter(x=n, y=list(res.cached_tokens), mode="lines+markers", name=name,
                                 line={"color": colour(name)}, customdata=list(res.queried_tokens),
                                 hovertemplate="request %{x}: %{y} of %{customdata} prompt tokens cached<extra>"
                                               + name + "</extra>"))
        notes.append(f"{name}: {res.hits:,} of {res.queries:,} prompt tokens hit ({res.hit_rate:.0%})")
    fig.update_xaxes(title_text="request (1 = first sent)")
    fig.update_yaxes(title_text="cached prompt tokens (tokens)", rangemode="tozero")
    return finish(fig, "Where the shared part goes decides what is cached", SIMULATED, notes=notes)


def scarce_memory(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Hit rate and evictions against the cache's capacity, per arrival order (`prefix.scarce_memory_rows`)."""
    if not rows:
        raise ValueError("scarce_memory: no rows. Fix: pass experiments.prefix.scarce_memory_rows().")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=("hit rate", "evictions"))
    for order in dict.fromkeys(r["order"] for r in rows):
        mine = sorted((r for r in rows if r["order"] == order), key=lambda r: r["num_blocks"])
        x = [r["num_blocks"] for r in mine]
        line = {"color": colour(order)}
        fig.add_trace(go.Scatter(x=x, y=[100 * r["hit_rate"] for r in mine], mode="lines+markers", name=order,
                                 legendgroup=order, line=line,
                                 hovertemplate="%{x} blocks: %{y:.1f}% hit<extra>" + order + "</extra>"), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=[r["evictions"] for r in mine], mode="lines+markers", name=order,
                                 legendgroup=order, showlegend=False, line=line,
                                 hovertemplate="%{x} blocks: %{y} evicted<extra>" + order + "</extra>"), 1, 2)
    need = rows[0]["prefix_blocks"]
    for col in (1, 2):
        fig.add_vline(x=need, line={"color": "gray", "dash": "dot"}, row=1, col=col)
    fig.add_annotation(text=f"all prefixes:<br>{need} blocks", x=need, xref="x", yref="y domain", y=0.5,
                       xanchor="left", showarrow=False, font={"size": 11, "color": "gray"})
    fig.update_xaxes(title_text="cache capacity (blocks of 16 tokens)")
    fig.update_yaxes(title_text="hit rate (% of prompt)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="hashes evicted (blocks)", rangemode="tozero", row=1, col=2)
    notes = [("grouped: each prefix's requests one after another; popular: every other request shares one prefix; "
              "round-robin: each prefix comes back only after all the others")]
    return finish(fig, "Scarce KV memory: LRU evicts prefixes before they come back", SIMULATED, notes=notes,
                  legend_below=True, height=460)


def _model_label(model: str) -> str:
    return f"{model.removeprefix('synthetic:')} (synthetic)" if model.startswith("synthetic:") else model


def on_off_figure(data: Shown | Sequence[Mapping[str, Any]], where: str = "") -> go.Figure:
    """vLLM's TTFT p50 with prefix caching on and off, and its hit rate, against the shared-prefix length.

    `data`: `experiments.prefix.on_off(...)` (a Shown; not recorded yet draws the empty axes under its label)
    or its "runs" rows with `where` saying where they were measured."""
    if isinstance(data, Shown):
        runs, where = (data.value or {}).get("runs", []), data.label
    else:
        runs = list(data)
    runs = [r for r in runs if r.get("kind", "shared-first") == "shared-first"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("TTFT p50", "hit rate (vLLM's counters)"))
    unit, scale, log = time_axis([r["ttft_p50_s"] for r in runs])
    models = list(dict.fromkeys(r["model"] for r in runs))
    for m, model in enumerate(models):
        for caching, name in (("on", ON), ("off", OFF)):
            mine = sorted((r for r in runs if r["model"] == model and r["caching"] == caching),
                          key=lambda r: r["shared_tokens"])
            if not mine:
                continue
            label = name + (f" · {_model_label(model)}" if len(models) > 1 else "")
            line = {"color": colour(name), "dash": ("solid", "dash", "dot")[m % 3]}
            fig.add_trace(go.Scatter(x=[r["shared_tokens"] for r in mine], y=[r["ttft_p50_s"] * scale for r in mine],
                                     mode="lines+markers", name=label, legendgroup=label, line=line,
                                     hovertemplate="%{x} shared tokens: %{y:.1f} " + unit + "<extra></extra>"), 1, 1)
            if caching == "on":
                fig.add_trace(go.Scatter(x=[r["shared_tokens"] for r in mine],
                                         y=[100 * (r["hit_rate"] or 0.0) for r in mine], mode="lines+markers",
                                         name=label, legendgroup=label, showlegend=False, line=line,
                                         hovertemplate="%{x} shared tokens: %{y:.1f}% hit<extra></extra>"), 1, 2)
    fig.update_xaxes(title_text="shared prefix (tokens)")
    fig.update_yaxes(title_text=f"TTFT p50 ({unit})", type="log" if log else None, row=1, col=1)
    fig.update_yaxes(title_text="hit rate (% of prompt)", rangemode="tozero", row=1, col=2)
    notes = ["every request of a set arrives at once; with caching on each run starts from a reset cache"]
    return finish(fig, "vLLM with prefix caching on and off", where,
                  synthetic=any(str(m).startswith("synthetic:") for m in models), notes=notes, legend_below=True,
                  height=460)


COUNTED, PREDICTED = "hit rate: the server's counters", "hit rate: the simulator's prediction"


def serve_figure(data: Shown | Sequence[Mapping[str, Any]], where: str = "") -> go.Figure:
    """The server's hit rate (its /metrics counters) beside the simulator's, and TTFT p50 and p99, against the rate.

    `data`: `experiments.prefix.serving.serve(...)` (a Shown; not recorded yet draws the empty axes under its label)
    or its rows with `where` saying where they were measured."""
    if isinstance(data, Shown):
        rows, where = list(data.value or []), data.label
    else:
        rows = list(data)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("hit rate (the server's /metrics counters)", "TTFT"))
    on = sorted((r for r in rows if r["caching"] == "on"), key=lambda r: r["rate"])
    if on:
        x = [r["rate"] for r in on]
        fig.add_trace(go.Scatter(x=x, y=[None if r["hit_rate"] is None else 100 * r["hit_rate"] for r in on],
                                 mode="lines+markers", name=COUNTED, line={"color": colour(ON)}, marker={"size": 10},
                                 hovertemplate="%{x:g} req/s: %{y:.1f}% hit<extra>/metrics</extra>"), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=[100 * r["predicted_hit_rate"] for r in on], mode="lines+markers",
                                 name=PREDICTED, line={"color": colour(PREDICTED), "dash": "dash"},
                                 marker={"symbol": "x", "size": 8},
                                 hovertemplate="%{x:g} req/s: %{y:.1f}% predicted<extra></extra>"), 1, 1)
    unit, scale, log = time_axis([r[k] for r in rows for k in ("ttft_p50_s", "ttft_p99_s")])
    for caching, name in (("on", ON), ("off", OFF)):
        mine = sorted((r for r in rows if r["caching"] == caching), key=lambda r: r["rate"])
        for stat, dash in (("p50", "solid"), ("p99", "dot")):
            fig.add_trace(go.Scatter(x=[r["rate"] for r in mine], y=[r[f"ttft_{stat}_s"] * scale for r in mine],
                                     mode="lines+markers", name=f"TTFT {stat} · {name}",  # one legend row
                                     line={"color": colour(name), "dash": dash},
                                     hovertemplate="%{x:g} req/s: %{y:.1f} " + unit + "<extra>" + stat + "</extra>"),
                          1, 2)
    fig.update_xaxes(title_text="offered load (requests/s, Poisson arrivals)", type="log")
    fig.update_yaxes(title_text="hit rate (% of prompt)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=f"time to first token ({unit})", type="log" if log else None, row=1, col=2)
    sets = sorted({f"{r['workload']} ({r['requests']} requests a test)" for r in rows})
    notes = [", ".join(sets) or "no load tests to show",
             "each test from an empty cache (POST /reset_prefix_cache); with caching off the counters do not move"]
    models = {str(r["model"]) for r in rows}
    title = "vLLM's server under load: prefix-cache hit rate and TTFT" + (
        f" ({', '.join(sorted(_model_label(m) for m in models))})" if models else "")
    return finish(fig, title, where, synthetic=any(m.startswith("synthetic:") for m in models), notes=notes,
                  legend_below=True, height=480)
