"""Lab 08's explorer: alpha, k, the draft's cost and the batch in; the predicted speedup out, measured points on it.

Leviathan's model (`lablib.mechanisms.speculative`): a verify step yields E(alpha, k) = 1 + alpha + ... + alpha^k
tokens and costs k c + verify_cost target steps, so the speedup over plain decoding is E / (k c + verify_cost).
While the target is memory-bound the verify pass costs one step (verify_cost 1), and that is the top row of the
figure: tokens per step and speedup against k at the chosen alpha and c, the best k (`optimal_k`) marked. The
bottom row lets the batch grow on a GPU's spec-sheet roofline (`speedup_vs_batch`): the verify pass over k + 1
positions stops being free once the step turns compute-bound, and the speedup falls below 1 at the reversal batch
(`reversal_batch`). The draft there is a model c times the target's size (c of its bytes and of its FLOPs), so c
is the same at every batch, as for a real 1B draft of an 8B target in bf16; c = 0 is an n-gram drafter.

What was measured is drawn on the curves, each with where it was measured: the CPU loop's counted acceptance
length and measured speedup per k (`experiments.speculative.cpu_study`, live on this CPU; tiny overhead-bound
models, so their verify pass costs more than one step) and vLLM's speedup per batch and method
(`gpu_study`, live or recorded on the GPU; "not recorded yet" draws nothing and says so under the figure).

`speedup_view` computes everything drawn and written (plain data, tested without a browser); `speedup_figure`
draws it; `SpeedupExplorer` only wires the controls to the two, as lab 01's and lab 03's panels do.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import validate
from ..experiments.speculative.maths import MODEL_BATCHES, roofline_of
from ..experiments.speculative.study import study_row
from ..experiments.speculative.vllm_runs import gpu_study
from ..mechanisms import speculative as maths
from ..mechanisms.gpus import GPU_PEAKS
from ..models.architecture import architectures
from ..plots.speculative import SPEEDUP_AXIS, colour_of
from ..plots.style import finish, rows_provenance
from ..session import Shown
from .figure import Explorer, FigureArea

OWNER = "SpeedupExplorer"
K_MAX, ALPHA_MAX, COST_MAX, BATCH_MAX = 16, 0.99, 1.5, 256  # the controls' ranges
BATCH_STEPS = tuple(sorted({round(2 ** (i / 4)) for i in range(33)}))  # 1..256, four steps per octave
GPUS = tuple(name for name, peak in GPU_PEAKS.items() if peak.bf16_flops)  # a roofline needs a bf16 peak
CURVE = {"tokens": "#e6550d", "speedup": "#0f9d9a", "best": "#d4a017"}
YOURS = {"color": "#d62728", "symbol": "circle-open", "size": 14, "line": {"width": 2}}  # the controls' point
NO_RUNS = "no vLLM runs given (pass gpu_study's result)"


def _checked(alpha: float, k: int, draft_cost: float, batch: int, gpu: str, target: str) -> None:
    validate.number(OWNER, "alpha", alpha, "a per-token acceptance probability, e.g. 0.8.", 0.0, ALPHA_MAX)
    validate.integer(OWNER, "k", k, "draft 1 to 16 tokens per step, e.g. k=4.", 1, K_MAX)
    validate.number(OWNER, "draft_cost", draft_cost, "one draft forward / one target forward: 0 for n-gram, "
                    "about 0.15 for a 1B draft of an 8B target.", 0.0, COST_MAX)
    validate.integer(OWNER, "batch", batch, "sequences decoding together, e.g. 32.", 1, BATCH_MAX)
    validate.choice(OWNER, "gpu", gpu, GPUS)
    validate.choice(OWNER, "target", target, tuple(architectures()))


def cpu_points(study: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The CPU loop's rows of `cpu_study` the explorer draws: per k, its fitted alpha, counted length, speedups."""
    keys = ("k", "alpha", "measured_length", "length_stderr", "measured_speedup", "predicted_speedup", "c",
            "verify_cost")
    return [{key: r[key] for key in keys} for r in (study or {}).get("rows", []) if r["k"] <= K_MAX]


def vllm_points(runs: Shown | dict[str, Any] | None) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """vLLM's speculative rows of `gpu_study` by setting name (sorted by batch), and where they were measured."""
    value = runs.value if isinstance(runs, Shown) else runs
    rows = [r for r in (value or {}).get("rows", []) if r.get("method") not in (None, "baseline")
            and r.get("speedup") is not None]
    if not rows:
        return {}, (runs.label if isinstance(runs, Shown) else NO_RUNS)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["batch"]):
        by_name.setdefault(r["name"], []).append({key: r.get(key) for key in
                                                  ("batch", "speedup", "k", "method", "mean_acceptance_length")})
    return by_name, rows_provenance(rows)


def speedup_view(alpha: float, k: int, draft_cost: float, batch: int = 1, gpu: str = "H200",
                 target: str = "llama-3.1-8b", study: dict[str, Any] | None = None,
                 runs: Shown | dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the explorer draws and writes for one setting of its controls, as plain data.

    `k_curve`: per k in 1..16, E(alpha, k) and speedup(alpha, k, draft_cost) (verify_cost 1, exactly the
    mechanism's numbers); `optimum`: `optimal_k`'s (k, speedup); `batch_curve`: `speedup_vs_batch` on `gpu`'s
    roofline of `target` in bf16 (draft: draft_cost x the target; none at c = 0), batches 1..512; `at_batch`: the
    point at `batch`; `reversal`: the first batch slower than plain decoding (to 4096; None if none). `cpu` and
    `vllm`: the measured points (`cpu_points`, `vllm_points`) with their provenance; `captions`: one line per layer.
    """
    _checked(alpha, k, draft_cost, batch, gpu, target)
    ks = list(range(1, K_MAX + 1))
    best_k, best = maths.optimal_k(alpha, draft_cost, K_MAX)
    t = roofline_of(target, gpu)
    d = None if draft_cost == 0 else dataclasses.replace(t, weight_bytes=t.weight_bytes * draft_cost,
                                                         flops_per_token=t.flops_per_token * draft_cost)
    cpu = cpu_points(study)
    vllm, vllm_where = vllm_points(runs)
    view = {"settings": {"alpha": alpha, "k": k, "draft_cost": draft_cost, "batch": batch, "gpu": gpu,
                         "target": target},
            "tokens_per_step": float(maths.expected_tokens_per_step(alpha, k)),
            "speedup": float(maths.speedup(alpha, k, draft_cost)),
            "k_curve": {"k": ks, "tokens_per_step": [float(maths.expected_tokens_per_step(alpha, j)) for j in ks],
                        "speedup": [float(maths.speedup(alpha, j, draft_cost)) for j in ks]},
            "optimum": {"k": best_k, "speedup": float(best)},
            "break_even_alpha": maths.break_even_alpha(k, draft_cost),
            "batch_curve": maths.speedup_vs_batch(alpha, k, MODEL_BATCHES, t, d),
            "at_batch": maths.speedup_vs_batch(alpha, k, [batch], t, d)[0],
            "reversal": maths.reversal_batch(alpha, k, t, d),
            "cpu": cpu, "cpu_where": _cpu_where(study) if cpu else None, "vllm": vllm, "vllm_where": vllm_where}
    view["captions"] = _captions(view)
    view["text"] = _text(view)
    return view


def _cpu_where(study: dict[str, Any]) -> str:
    return (f"live on this CPU: the embedded pair, {study['prompts']} journey prompts x {study['max_new_tokens']} "
            f"new tokens ({study['provenance']})")


def _captions(view: dict[str, Any]) -> list[str]:
    s = view["settings"]
    drafter = f"a draft {s['draft_cost']:.3g} x its size" if s["draft_cost"] else "an n-gram drafter (no draft forward)"
    lines = [(f"Curves: simulated, the formula (i.i.d. acceptance). Bottom: {s['gpu']} spec-sheet roofline, "
              f"{s['target']} target in bf16 with {drafter}, no launch overhead or KV reads (real reversals come "
              "sooner).")]
    if view["cpu"]:
        v = ", ".join(f"k={p['k']}: c {p['c']:.2f}, verify_cost {p['verify_cost']:.2f}" for p in view["cpu"])
        lines.append(f"Dots: {view['cpu_where']}. Its own costs ({v}) are not the curve's: purple is the formula "
                     "at the loop's alpha, c and verify_cost.")
    else:
        lines.append("CPU loop: no study given (pass cpu_study's result), so no measured points on the top row.")
    if view["vllm"]:
        lines.append(f"Squares: vLLM, {view['vllm_where']}: the embedded pair (launch-overhead-bound), "
                     "speedup over the pinned baseline; not the roofline's model.")
    else:
        lines.append(f"vLLM: nothing drawn: {view['vllm_where']}")
    return lines


def _text(view: dict[str, Any]) -> str:
    s, p, best, even = view["settings"], view["at_batch"], view["optimum"], view["break_even_alpha"]
    a, k, c = s["alpha"], s["k"], s["draft_cost"]
    even_text = ("no alpha pays" if even is None else "any alpha pays" if even == 0 else
                 f"it pays above alpha {even:.2f}")
    rev = view["reversal"]
    rev_text = ("slower than plain decoding already at batch 1" if rev == 1 else
                "never slower up to batch 4096" if rev is None else f"slower than plain decoding from batch {rev}")
    return (f"<b>E = {view['tokens_per_step']:.2f} tokens per verify step</b> at alpha {a:.2f}, k = {k}; "
            f"<b>speedup {view['speedup']:.2f}x</b> with drafts costing c = {c:.3f} target steps "
            f"(k c + 1 = {k * c + 1:.2f} steps per verify step, memory-bound target); {even_text} at this k and c. "
            f"Best k here: {best['k']} ({best['speedup']:.2f}x).<br>"
            f"On the {s['gpu']} roofline ({s['target']}, bf16) at batch {p.batch}: verify pass {p.verify_cost:.2f} "
            f"target steps, <b>speedup {p.speedup:.2f}x</b>; {rev_text}.")


def speedup_figure(view: dict[str, Any]) -> go.Figure:
    """`speedup_view` drawn: tokens per step and speedup against k (top), speedup against batch size (bottom)."""
    s, curve = view["settings"], view["k_curve"]
    fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], vertical_spacing=0.16,
                        subplot_titles=[f"tokens per verify step, alpha = {s['alpha']:.2f}",
                                        f"speedup, alpha = {s['alpha']:.2f}, c = {s['draft_cost']:.3f}",
                                        f"speedup against batch size, k = {s['k']} ({s['gpu']} roofline)"])
    fig.add_scatter(x=curve["k"], y=curve["tokens_per_step"], mode="lines+markers", name="formula E(alpha, k)",
                    line={"color": CURVE["tokens"]}, hovertemplate="k=%{x}: E = %{y:.3f}<extra></extra>", row=1, col=1)
    fig.add_scatter(x=curve["k"], y=curve["speedup"], mode="lines+markers", name="formula E / (k c + 1)",
                    line={"color": CURVE["speedup"]}, hovertemplate="k=%{x}: %{y:.3f}x<extra></extra>", row=1, col=2)
    best = view["optimum"]
    fig.add_scatter(x=[best["k"]], y=[best["speedup"]], mode="markers", name="best k (optimal_k)",
                    marker={"color": CURVE["best"], "symbol": "star", "size": 16},
                    hovertemplate="best k=%{x}: %{y:.3f}x<extra></extra>", row=1, col=2)
    for col, y in ((1, view["tokens_per_step"]), (2, view["speedup"])):
        fig.add_scatter(x=[s["k"]], y=[y], mode="markers", name="your setting", legendgroup="yours",
                        showlegend=col == 1, marker=YOURS, hovertemplate="your k=%{x}: %{y:.3f}<extra></extra>",
                        row=1, col=col)
    _cpu_traces(fig, view["cpu"])
    batch = view["batch_curve"]
    fig.add_scatter(x=[p.batch for p in batch], y=[p.speedup for p in batch], mode="lines",
                    name="formula on the roofline", line={"color": CURVE["speedup"]},
                    customdata=[[p.draft_cost, p.verify_cost] for p in batch], row=2, col=1,
                    hovertemplate="batch %{x}: %{y:.2f}x (c %{customdata[0]:.3f}, verify_cost "
                                  "%{customdata[1]:.2f})<extra></extra>")
    here = view["at_batch"]
    fig.add_scatter(x=[here.batch], y=[here.speedup], mode="markers", name="your setting", legendgroup="yours",
                    showlegend=False, row=2, col=1, marker=YOURS,
                    hovertemplate="your batch %{x}: %{y:.3f}x<extra></extra>")
    rev = view["reversal"]
    if rev is not None and rev <= MODEL_BATCHES[-1]:  # a trace, not a shape: data coordinates on the log axis
        fig.add_scatter(x=[rev, rev], y=[0, 1], mode="lines+text", name="reversal batch",
                        text=["", f" slower from batch {rev}"], textposition="top right",
                        line={"color": CURVE["speedup"], "dash": "dash", "width": 1},
                        hovertemplate=f"slower than plain decoding from batch {rev}<extra></extra>", row=2, col=1)
    for name, points in view["vllm"].items():
        fig.add_scatter(x=[p["batch"] for p in points], y=[p["speedup"] for p in points], mode="lines+markers",
                        name=f"vLLM {name}", line={"color": colour_of(name), "dash": "dot"},
                        marker={"symbol": "square", "size": 9},
                        customdata=[[p["mean_acceptance_length"] or 0] for p in points], row=2, col=1,
                        hovertemplate=f"vLLM {name}, batch %{{x}}: %{{y:.2f}}x (mean acceptance length "
                                      f"%{{customdata[0]:.2f}}; {view['vllm_where']})<extra></extra>")
    for row, col in ((1, 2), (2, 1)):
        fig.add_hline(y=1.0, line={"color": "#7f7f7f", "dash": "dot", "width": 1}, row=row, col=col)
    fig.update_xaxes(title_text="k (draft tokens per step)", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="k (draft tokens per step)", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="tokens per verify step (tokens)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=SPEEDUP_AXIS, rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="batch size (sequences per step, log scale)", type="log", row=2, col=1)
    fig.update_yaxes(title_text=SPEEDUP_AXIS, rangemode="tozero", row=2, col=1)
    where = ["curves simulated (the formula)", *(["dots live on this CPU"] if view["cpu"] else []),
             f"squares {view['vllm_where']}" if view["vllm"] else "vLLM not drawn"]
    return finish(fig, "Speculative decoding: the predicted speedup, with what was measured", "; ".join(where),
                  legend_below=True, height=820)


def _cpu_traces(fig: go.Figure, cpu: list[dict[str, Any]]) -> None:
    """The CPU loop per k: counted acceptance length (top left); measured and predicted speedup (top right)."""
    if not cpu:
        return
    ks = [p["k"] for p in cpu]
    name = "counted by the loop (+/- 3 se)"
    fig.add_scatter(x=ks, y=[p["measured_length"] for p in cpu], mode="markers", name=name, row=1, col=1,
                    marker={"color": colour_of(name), "size": 10}, customdata=[[p["alpha"]] for p in cpu],
                    error_y={"type": "data", "array": [3 * p["length_stderr"] for p in cpu]},
                    hovertemplate="loop, k=%{x}: %{y:.3f} tokens per step (its alpha %{customdata[0]:.3f}; "
                                  "live on this CPU)<extra></extra>")
    for name, key, symbol in (("this run (median of rounds)", "measured_speedup", "circle"),
                              ("formula: forwards timed alone", "predicted_speedup", "diamond-open")):
        fig.add_scatter(x=ks, y=[p[key] for p in cpu], mode="markers", name=name, row=1, col=2,
                        marker={"color": colour_of(name), "size": 10, "symbol": symbol, "line": {"width": 2}},
                        customdata=[[p["alpha"], p["c"], p["verify_cost"]] for p in cpu],
                        hovertemplate=f"loop, k=%{{x}}: %{{y:.3f}}x ({name}; alpha %{{customdata[0]:.3f}}, c "
                                      "%{customdata[1]:.3f}, verify_cost %{customdata[2]:.2f}; live on this CPU)"
                                      "<extra></extra>")


class SpeedupExplorer(Explorer):
    """Alpha, k, the draft's cost c, the batch and a GPU in; predicted speedup and tokens per step out, drawn."""

    def __init__(self, alpha: float = 0.8, k: int = 4, draft_cost: float = 0.125, batch: int = 1, gpu: str = "H200",
                 target: str = "llama-3.1-8b", study: dict[str, Any] | None = None,
                 runs: Shown | dict[str, Any] | None = None):
        self.study, self.runs = study, runs
        self.view = speedup_view(alpha, k, draft_cost, batch, gpu, target, study, runs)  # refuses bad values first
        slider = {"continuous_update": False, "style": {"description_width": "initial"}}
        self.alpha = widgets.FloatSlider(value=alpha, min=0.0, max=ALPHA_MAX, step=0.01, readout_format=".3f",
                                         description="acceptance alpha", **slider)
        self.k = widgets.IntSlider(value=k, min=1, max=K_MAX, description="k (drafts per step)", **slider)
        self.draft_cost = widgets.FloatSlider(value=draft_cost, min=0.0, max=COST_MAX, step=0.005,
                                              readout_format=".3f", description="draft cost c", **slider)
        self.batch = widgets.SelectionSlider(options=sorted({*BATCH_STEPS, batch}), value=batch,
                                             description="batch size", **slider)
        self.gpu = widgets.Dropdown(options=GPUS, value=gpu, description="GPU")
        self.target = widgets.Dropdown(options=tuple(architectures()), value=target, description="target")
        self.text = widgets.HTML()
        self.caption = widgets.HTML()
        self.area = FigureArea(height="820px")
        for w in (self.alpha, self.k, self.draft_cost, self.batch, self.gpu, self.target):
            w.observe(self.value_changed, names="value")
        self.widget = widgets.VBox([widgets.HBox([self.alpha, self.k, self.draft_cost]),
                                    widgets.HBox([self.batch, self.gpu, self.target]), self.text, self.area.output,
                                    self.caption])
        self.show(self.view)

    @classmethod
    def from_lab(cls, study: dict[str, Any] | None = None, runs: Shown | dict[str, Any] | None = None, k: int = 4,
                 **controls: Any) -> SpeedupExplorer:
        """Start at what this run measured: alpha from the study's row for k (else its first), c from its forwards.

        `runs` defaults to vLLM's recording (`gpu_study(..., force=False)`: no engine starts), or "not recorded yet".
        """
        if runs is None:
            runs = gpu_study(batches=(1, 4, 16, 64), ks=(2, 4), force=False)
        if study and study.get("rows"):
            row = study_row(study, k) if any(r["k"] == k for r in study["rows"]) else study["rows"][0]
            controls = {"alpha": min(row["alpha"], ALPHA_MAX), "draft_cost": min(study["costs"]["c"], COST_MAX),
                        **controls}
        return cls(k=k, study=study, runs=runs, **controls)

    @property
    def figure(self) -> go.Figure:
        """The figure the explorer shows now (a plain plotly Figure, redrawn whole on every change)."""
        return self.area.figure

    def settings(self) -> dict[str, Any]:
        """The controls' values, as `speedup_view` takes them."""
        return {"alpha": self.alpha.value, "k": self.k.value, "draft_cost": self.draft_cost.value,
                "batch": self.batch.value, "gpu": self.gpu.value, "target": self.target.value}

    def compute(self, settings: dict[str, Any]) -> dict[str, Any]:
        return speedup_view(**settings, study=self.study, runs=self.runs)

    def draw(self, view: dict[str, Any]) -> go.Figure:
        return speedup_figure(view)
