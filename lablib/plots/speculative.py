"""Speculative-decoding pictures (lab 08): what the formula promises, what the loop counts, where it stops paying.

- `speedup_vs_alpha`: Leviathan's speedup E / (k c + 1) against the per-token acceptance alpha, one panel
  per k, one line per draft cost c, the break-even alpha marked: a cheap drafter pays at any alpha, a
  draft as slow as the target never does.
- `acceptance_figure`: the loop on the embedded pair, per k: P(position i accepted) counted against
  alpha^i at the fitted alpha, and the mean acceptance length (+/- 3 standard errors) against E(alpha, k).
- `cpu_speed_figure`: on this CPU, the speedup over plain greedy decoding this run measured, next to
  the two predictions (c and verify_cost from forwards timed alone, and timed inside the loop).
- `batch_figure`: the roofline model at 8B scale, speedup against batch size for a draft model and an
  n-gram drafter, the batch where each reverses marked: a model, labelled as one.
- `vllm_speedup_figure`: vLLM's runs (live, recorded, or not recorded yet), speedup over the pinned
  baseline against batch size, with what vLLM's default engine settings alone change.
- `eagle_figure`: the EAGLE head on the synthetic 8B: speedup against batch per k (the 1B draft model beside
  it), and batch 1's tokens per second against the bandwidth ceilings plain decoding cannot pass.

Colours: one per drafter and k (`colour_of`), the same in every figure of this module.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..mechanisms.speculative import break_even_alpha, speedup
from ..session import Shown
from .style import finish, ordered_colours, rows_provenance

SPEEDUP_AXIS = "speedup over plain decoding (x)"
# a ramp per drafter, light to dark as k grows (k = 1, 2, 4, 8 ...); baselines grey and green
RAMPS = {"draft model": ["#9ecae1", "#6baed6", "#2171b5", "#08306b"],
         "n-gram": ["#fcae91", "#fb6a4a", "#cb181d", "#67000d"],
         "EAGLE head": ["#bcbddc", "#9e9ac8", "#807dba", "#6a51a3", "#54278f", "#3f007d"]}  # k = 1..6, one each
FIXED = {"baseline, pinned (V1, no async)": "#7f7f7f", "baseline, vLLM defaults": "#2ca02c",
         "plain decoding (speedup 1)": "#7f7f7f", "break-even": "#000000",
         "counted by the loop (+/- 3 se)": "#000000", "formula E(alpha, k)": "#e6550d",
         "this run (median of rounds)": "#000000", "formula: forwards timed alone": "#9467bd",
         "formula: forwards timed in the loop": "#e6550d"}


def colour_of(name: str) -> str:
    """The colour of a drafter at a k ("draft model k=4", "n-gram k=2 (lookup 2-5)"), a baseline or a shared series."""
    if name in FIXED:
        return FIXED[name]
    for drafter, ramp in RAMPS.items():
        if name.startswith(drafter):
            k = next((int(w[2:]) for w in name.replace(",", " ").split() if w.startswith("k=") and w[2:].isdigit()), 4)
            i = k - 1 if len(ramp) >= 6 else k.bit_length() - 1  # the head's ramp has a shade per k; the others' per 2^i
            return ramp[min(len(ramp) - 1, max(0, i))]
    for k, ramp_colour in zip((1, 2, 4, 8), RAMPS["draft model"]):
        if name.startswith(f"k={k},"):
            return ramp_colour
    return "#7f7f7f"


def speedup_vs_alpha(ks: Sequence[int] = (2, 4, 8), costs: Sequence[float] = (0.0, 0.05, 0.2, 0.5, 1.0),
                     points: int = 101) -> go.Figure:
    """Speedup against alpha, a panel per k, a line per draft cost c (verify_cost 1), break-even alphas marked."""
    alphas = [i / (points - 1) for i in range(points)]
    fig = make_subplots(rows=1, cols=len(ks), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"k = {k} drafts per step" for k in ks])
    palette = dict(zip(costs, ordered_colours(len(costs))))
    for col, k in enumerate(ks, start=1):
        for c in costs:
            name = f"c = {c:g}" + (" (n-gram)" if c == 0 else " (draft as slow as target)" if c == 1 else "")
            fig.add_scatter(x=alphas, y=[float(speedup(a, k, c)) for a in alphas], mode="lines", name=name,
                            line={"color": palette[c]}, legendgroup=name, showlegend=col == 1, row=1, col=col,
                            hovertemplate=f"k={k}, c={c:g}: alpha %{{x:.2f}} -> %{{y:.2f}}x<extra></extra>")
        even = [(c, break_even_alpha(k, c)) for c in costs]
        even = [(c, a) for c, a in even if a is not None and 0 < a < 1]
        fig.add_scatter(x=[a for _, a in even], y=[1.0] * len(even), mode="markers", name="break-even",
                        marker={"color": FIXED["break-even"], "symbol": "x", "size": 9}, legendgroup="break-even",
                        showlegend=col == 1, row=1, col=col, text=[f"c={c:g}" for c, _ in even],
                        hovertemplate="break-even at alpha %{x:.3f} (%{text})<extra></extra>")
        fig.add_hline(y=1.0, line={"color": "#7f7f7f", "dash": "dot", "width": 1}, row=1, col=col)
        fig.update_xaxes(title_text="per-token acceptance alpha (probability)", range=[0, 1], row=1, col=col)
    fig.update_yaxes(type="log")  # matched axes share one type
    fig.update_yaxes(title_text=SPEEDUP_AXIS, row=1, col=1)
    return finish(fig, "Speculative decoding's promise: speedup E / (k c + 1) against acceptance",
                  "simulated (the formula, no engine ran): i.i.d. acceptance, verify pass = one target step",
                  notes=["c = one draft forward / one target forward. x: where speculation breaks even (speedup 1)."],
                  height=430)


def _study_where(study: dict[str, Any]) -> str:
    return (f"live on this CPU: the embedded pair, {study['prompts']} journey prompts x {study['max_new_tokens']} "
            f"new tokens; {study['provenance'].replace('measured on ', '')}")


def acceptance_figure(study: dict[str, Any]) -> go.Figure:
    """Per k of `cpu_study`: per-position acceptance counted vs alpha^i, and the mean length vs E(alpha, k)."""
    rows = study["rows"]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        subplot_titles=["P(draft position i accepted)", "tokens per verify step"])
    for r in rows:
        k, pos = r["k"], list(range(1, r["k"] + 1))
        counted, formula = f"k={k}, counted (+/- 3 se)", f"k={k}, formula alpha^i (alpha={r['alpha']:.2f})"
        fig.add_scatter(x=pos, y=r["measured_per_position"], mode="markers", name=counted,
                        marker={"color": colour_of(counted), "size": 9},
                        error_y={"type": "data", "array": [3 * s for s in r["stderr_per_position"]]},
                        hovertemplate=f"k={k}, position %{{x}}: %{{y:.3f}}<extra></extra>", row=1, col=1)
        fig.add_scatter(x=pos, y=r["predicted_per_position"], mode="lines", name=formula,
                        line={"color": colour_of(formula), "dash": "dash"},
                        hovertemplate=f"k={k}, alpha^%{{x}} = %{{y:.3f}}<extra></extra>", row=1, col=1)
    ks = [r["k"] for r in rows]
    name = "counted by the loop (+/- 3 se)"
    fig.add_scatter(x=ks, y=[r["measured_length"] for r in rows], mode="markers", name=name,
                    marker={"color": colour_of(name), "size": 10},
                    error_y={"type": "data", "array": [3 * r["length_stderr"] for r in rows]},
                    hovertemplate="k=%{x}: %{y:.3f} tokens per step<extra></extra>", row=1, col=2)
    name = "formula E(alpha, k)"
    fig.add_scatter(x=ks, y=[r["predicted_length"] for r in rows], mode="markers", name=name,
                    marker={"color": colour_of(name), "symbol": "diamond-open", "size": 12, "line": {"width": 2}},
                    hovertemplate="k=%{x}: E = %{y:.3f}<extra></extra>", row=1, col=2)
    fig.update_xaxes(title_text="draft position i (tokens into the draft)", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="acceptance (fraction of verify steps)", range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="k (draft tokens per step)", type="category", row=1, col=2)
    fig.update_yaxes(title_text="mean acceptance length (tokens per step)", rangemode="tozero", row=1, col=2)
    return finish(fig, "The loop's acceptance against the i.i.d. formula", _study_where(study), legend_below=True,
                  notes=[("alpha fitted per k from the per-position counts (maximum likelihood); greedy, so "
                          "deterministic: the error bars are sampling error over prompts and steps.")], height=520)


def cpu_speed_figure(study: dict[str, Any]) -> go.Figure:
    """Per k: the speedup this run measured on this CPU, next to the two predictions E / (k c + verify_cost)."""
    rows = study["rows"]
    ks = [f"k={r['k']}" for r in rows]
    fig = go.Figure()
    for name, key in (("this run (median of rounds)", "measured_speedup"),
                      ("formula: forwards timed alone", "predicted_speedup"),
                      ("formula: forwards timed in the loop", "predicted_speedup_in_loop")):
        fig.add_bar(x=ks, y=[r[key] for r in rows], name=name, marker_color=colour_of(name),
                    text=[f"{r[key]:.2f}x" for r in rows], textposition="outside", cliponaxis=False,
                    hovertemplate="%{x}: %{y:.3f}x<extra></extra>")
    fig.add_hline(y=1.0, line={"color": "#7f7f7f", "dash": "dot"})
    top = max(max(r[k] for k in ("measured_speedup", "predicted_speedup", "predicted_speedup_in_loop")) for r in rows)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="draft tokens per step")
    fig.update_yaxes(title_text="speedup over greedy decoding (x)", range=[0, max(1.2, top * 1.2)])
    return finish(fig, "On this CPU: predicted against measured speedup", _study_where(study),
                  notes=["A shared CPU: other jobs run at the same time, so these timings are noisy.",
                         (f"greedy: {study['baseline_tok_s']:.0f} tok/s; c = {study['costs']['c']:.2f} "
                          "(one draft forward / one target forward, timed alone).")])


def batch_figure(model: dict[str, Any]) -> go.Figure:
    """`batch_model(...)`: the speedup against batch size for each drafter, each reversal batch marked."""
    fig = go.Figure()
    k = model["k"]
    for drafter, points in model["curves"].items():
        name = f"{drafter} k={k}"
        fig.add_scatter(x=[p.batch for p in points], y=[p.speedup for p in points], mode="lines", name=name,
                        line={"color": colour_of(name)}, customdata=[[p.draft_cost, p.verify_cost] for p in points],
                        hovertemplate="batch %{x}: %{y:.2f}x (c %{customdata[0]:.3f}, verify_cost "
                                      "%{customdata[1]:.2f})<extra></extra>")
        b = model["reversal"][drafter]
        if b is not None:
            fig.add_vline(x=b, line={"color": colour_of(name), "dash": "dash", "width": 1})
            fig.add_annotation(x=math.log10(b), y=1.0, text=f"{drafter}: slower from batch {b}", showarrow=True, arrowhead=2,
                               ax=-60 if drafter == "draft model" else 40, ay=-40 if drafter == "draft model" else -70,
                               font={"size": 11, "color": colour_of(name)})
    fig.add_hline(y=1.0, line={"color": "#7f7f7f", "dash": "dot"})
    fig.update_xaxes(title_text="batch size (sequences per step, log scale)", type="log")
    fig.update_yaxes(title_text=SPEEDUP_AXIS, rangemode="tozero")
    return finish(fig, "Where speculation stops paying: speedup against batch size (a model)", model["where"],
                  notes=[(f"alpha = {model['alpha']:.3f} (the embedded pair's, counted on this CPU), k = {k}: "
                          f"E = {model['tokens_per_step']:.2f} tokens per step. Below the GPU's ridge a verify pass "
                          "costs one step; past it, up to k + 1.")])


def vllm_speedup_figure(shown: Shown | dict[str, Any] | None) -> go.Figure:
    """vLLM's runs of `gpu_study`: speedup over the pinned baseline against batch size, one line per setting."""
    value = shown.value if isinstance(shown, Shown) else shown
    fig = go.Figure()
    title = "vLLM: speedup over the pinned baseline against batch size"
    if not value or not value.get("rows"):
        label = shown.label if isinstance(shown, Shown) else "not recorded yet"
        fig.add_annotation(text="nothing to draw here: " + label.split(":")[0], xref="paper", yref="paper", x=0.5,
                           y=0.5, showarrow=False, font={"size": 13, "color": "gray"})
        fig.update_xaxes(title_text="batch size (requests in flight, log scale)", type="log", showticklabels=False)
        fig.update_yaxes(title_text=SPEEDUP_AXIS, showticklabels=False)
        return finish(fig, title, label)
    rows = value["rows"]
    names = list(dict.fromkeys(r["name"] for r in rows if r["name"] != "baseline, pinned (V1, no async)"))
    for name in names:
        mine = sorted((r for r in rows if r["name"] == name), key=lambda r: r["batch"])
        fig.add_scatter(x=[r["batch"] for r in mine], y=[r["speedup"] for r in mine], mode="lines+markers", name=name,
                        line={"color": colour_of(name), "dash": "dot" if name.startswith("baseline") else "solid"},
                        customdata=[[r["output_tok_s"], r["mean_acceptance_length"] or 0] for r in mine],
                        hovertemplate="batch %{x}: %{y:.2f}x (%{customdata[0]:.0f} tok/s, mean acceptance "
                                      "length %{customdata[1]:.2f})<extra></extra>")
    fig.add_hline(y=1.0, line={"color": "#7f7f7f", "dash": "dot"})
    fig.update_xaxes(title_text="batch size (requests in flight, log scale)", type="log")
    fig.update_yaxes(title_text="speedup over the pinned baseline (x)", rangemode="tozero")
    return finish(fig, title, rows_provenance(rows),
                  notes=[("Every run pins the V1 model runner and async scheduling off (what vLLM 0.26 falls back "
                          "to for draft_model and ngram);"),
                         ("'baseline, vLLM defaults' (V2 runner, async on) is what that switch alone does (either way). "
                          "Embedded pair, journey prompts, greedy, fixed output lengths.")])


def eagle_figure(shown: Shown | None, draft: Shown | dict[str, Any] | None = None) -> go.Figure:
    """`eagle_8b.eagle_study`: left, the head's speedup over the pinned baseline against batch, one line per k
    (pinned, bf16), the 1B draft model's (`draft`: the synthetic study, or its value) dashed beside it; right,
    batch 1's tok/s per run against the ceiling of its weights (the study's "batch1": `batch1_roofline`)."""
    value = None if shown is None else shown.value
    draft = draft.value if isinstance(draft, Shown) else draft
    title = "EAGLE head on the synthetic 8B: where it pays, and past the bandwidth ceiling"
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        subplot_titles=("speedup over plain decoding, by batch", "batch 1 against the ceiling"))
    if not value or not value.get("rows"):
        label = "run lab.eagle_head_8b() first" if shown is None else shown.label
        fig.add_annotation(text="nothing to draw here: " + label.split(":")[0], xref="paper", yref="paper",
                           x=0.5, y=0.5, showarrow=False, font={"size": 13, "color": "gray"})
        return finish(fig, title, label)
    rows = sorted((r for r in value["rows"] if r["method"] == "eagle" and r["pinned"] and not r.get("quantization")),
                  key=lambda r: (r["batch"], r["k"]))  # pinned, bf16: the grid's own runs
    for k in sorted({r["k"] for r in rows}):
        mine = [r for r in rows if r["k"] == k]
        name = f"EAGLE head k={k}"
        fig.add_scatter(x=[r["batch"] for r in mine], y=[r["speedup"] for r in mine], mode="lines+markers", name=name,
                        line={"color": colour_of(name)}, row=1, col=1,
                        customdata=[[r["output_tok_s"], r.get("implied_c") or 0] for r in mine],
                        hovertemplate="batch %{x}: %{y:.2f}x (%{customdata[0]:,.0f} tok/s, c "
                                      "%{customdata[1]:.2f})<extra></extra>")
    drafts = sorted((r for r in (draft or {}).get("rows", []) if r.get("method") == "draft_model"),
                    key=lambda r: r["batch"])
    if drafts:
        name = f"1B draft model k={drafts[0]['k']}"
        fig.add_scatter(x=[r["batch"] for r in drafts], y=[r["speedup"] for r in drafts], mode="lines+markers",
                        name=name, line={"color": colour_of("draft model k=4"), "dash": "dash"}, row=1, col=1,
                        hovertemplate="batch %{x}: %{y:.2f}x<extra>" + name + "</extra>")
    fig.add_hline(y=1.0, line={"color": "#7f7f7f", "dash": "dot"}, row=1, col=1)
    roof = value.get("batch1") or []  # eagle_8b.batch1_roofline
    names = [("plain decoding" if r["k"] is None else f"EAGLE head k={r['k']}")
             + ("" if r["weights"] == "bf16" else f", {r['weights'].upper()}") + ("" if r["pinned"] else ", defaults")
             for r in roof]
    fig.add_bar(x=names, y=[r["output_tok_s"] for r in roof], row=1, col=2, showlegend=False,
                marker={"color": [colour_of(n) for n in names]},
                customdata=[[r["share_of_ceiling"] or 0] for r in roof],
                hovertemplate="%{x}: %{y:,.0f} tok/s (%{customdata[0]:.0%} of its ceiling)<extra></extra>")
    for weights in sorted({r["weights"] for r in roof if r["ceiling_tok_s"]}):
        ceiling = next(r["ceiling_tok_s"] for r in roof if r["weights"] == weights and r["ceiling_tok_s"])
        fig.add_hline(y=ceiling, line={"color": "#000000", "dash": "dash" if weights == "bf16" else "dot", "width": 1},
                      row=1, col=2, annotation_text=f"{weights} ceiling {ceiling:,.0f}",
                      annotation_position="top left", annotation_font={"size": 10})
    fig.update_xaxes(title_text="batch size (requests in flight, log scale)", type="log", row=1, col=1)
    fig.update_yaxes(title_text=SPEEDUP_AXIS, rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="output at batch 1 (tok/s)", rangemode="tozero", row=1, col=2)
    return finish(fig, title, shown.label if shown.live else rows_provenance(value["rows"]), legend_below=True,
                  notes=[(value.get("label") or "") + ". Every run pinned (V1 runner, async off) unless named; "
                         "the ceiling: the H200's spec-sheet bandwidth over the bytes one plain decode step reads."])
