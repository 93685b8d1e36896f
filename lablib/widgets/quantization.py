"""Lab 06's explorer: a scheme, a batch size and a model shape in; memory, speed and quality out, each with its source.

The three answers come from three places, and the explorer never blends them:

- Memory: on the embedded model, what each checkpoint made here stores (`storage_rows`, live on this CPU); on a
  real shape (Llama-3.1-8B, -70B), the package's byte arithmetic (`weights_alone`, `predicted_bytes`) in the
  format the scheme stores there (`weight_format`), and the KV cache that the same budget leaves on one H200:
  `weights_alone`'s 90% of the GPU less its engine reserve, less the weights, over the shape's KV bytes per token
  (`kv_bytes_per_token`, 1 byte for an FP8 KV cache). At batch B that capacity is B sequences of capacity / B
  tokens each: a smaller weight format is a longer context per sequence, or more sequences.
- Speed: decode tok/s at the batch, from vLLM's speed runs on the synthetic 8B (`speed`: live on a GPU, recorded
  on the H200, or "not recorded yet", which draws nothing and says which step records it).
- Quality: perplexity change, your gate's verdict and greedy agreement against bf16, from the lab's quality
  table (`quality_table`, live on this CPU, embedded model). The real shapes have no trained weights here (the
  speed runs use synthetic ones), so their quality is not measured: the explorer says so and shows the embedded
  model's, labelled as such.

`scheme_view` computes everything drawn and written (plain data, tested without a browser); `scheme_figure`
draws it; `QuantizationExplorer` only wires the controls to the two, as lab 08's `SpeedupExplorer` does.
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import validate
from ..experiments.quantization.recording import speed as speed_step
from ..experiments.quantization.speed_runs import BATCHES, SPEED_MODEL, SPEED_SCHEMES, VLLM_SWITCHES
from ..experiments.quantization.sizes import WEIGHT_FORMATS, linear_shapes, predicted_bytes, weights_alone
from ..experiments.quantization.measures import quality_gate
from ..hardware.fit import RESERVE_BYTES
from ..mechanisms.gpus import GPU_PEAKS
from ..models import architectures, kv_bytes_per_token
from ..models.quantize import SCHEMES as QUANTIZED
from ..models.quantize import default_group_size
from ..plots.quantization import CPU_WHERE, scheme_colour
from ..plots.style import finish, rows_provenance
from ..session import Shown
from .figure import Explorer, FigureArea

OWNER = "QuantizationExplorer"
SCHEMES = ("bf16", *QUANTIZED, *(s for s in SPEED_SCHEMES if s != "bf16" and s not in QUANTIZED))
_ALONE = inspect.signature(weights_alone).parameters  # the real shapes, the GPU and the context weights_alone sizes
MODELS = ("embedded", *_ALONE["models"].default)
GPU, CONTEXT = _ALONE["gpu"].default, _ALONE["context"].default
BUDGET = 0.9  # weights_alone's share of the GPU (vLLM's default gpu_memory_utilization)
NO_QUALITY = "no quality table given (pass step 4's rows, quality_table's result)"
NO_STORAGE = "no storage rows given (pass step 3's stored, storage_rows' result)"
NO_SPEED = "no speed runs given (pass step 8's Shown, speed()'s result)"


def weight_format(scheme: str, model: str) -> str | None:
    """The WEIGHT_FORMATS key a scheme's weights take on a real shape (None where the table has none).

    A checkpoint scheme by its bits, symmetry and group (the quantizer's `default_group_size` for the shape's
    widths); a vLLM switch: bf16 weights, or vLLM's online fp8, sized as the per-channel 8-bit format (vLLM keeps
    one scale per tensor instead: 2 bytes per output row less).
    """
    if scheme in VLLM_SWITCHES:
        key = (8, None, True) if VLLM_SWITCHES[scheme].get("quantization") == "fp8" else (16, None, True)
    else:
        s = QUANTIZED[scheme]
        widths = {name: k for name, _, k in linear_shapes(architectures()[model])}
        key = (s.weight_bits, default_group_size(widths) if s.grouped else None, s.symmetric)
    return next((f for f, v in WEIGHT_FORMATS.items() if v == key), None)


def _speed_rows(speed: Shown | Sequence[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], str]:
    rows = list((speed.value if isinstance(speed, Shown) else speed) or [])
    return rows, rows_provenance(rows) if rows else speed.label if isinstance(speed, Shown) else NO_SPEED


def batches_of(speed: Shown | Sequence[dict[str, Any]] | None) -> list[int]:
    """The batch sizes the speed runs hold (the speed step's BATCHES when there are none)."""
    rows, _ = _speed_rows(speed)
    return sorted({r["batch"] for r in rows}) or list(BATCHES)


def _memory(scheme: str, model: str, batch: int, stored: Sequence[dict[str, Any]] | None,
            speed: list[dict[str, Any]], speed_where: str) -> dict[str, Any]:
    """Weight bytes (and, on a real shape, the KV cache one H200 has left) of one scheme; `why` where there are none."""
    if model == "embedded":
        row = next((r for r in stored or [] if r["scheme"] == scheme), None)
        why = (NO_STORAGE if stored is None else "a vLLM switch on the bf16 weights: no checkpoint of its own here"
               if scheme in VLLM_SWITCHES else "not quantized in this run (add it to SCHEMES)")
        return ({"weight_bytes": row["file_bytes"], "vs_bf16": row["vs_bf16"], "where": f"{CPU_WHERE}: its files",
                 "bits_per_weight": row["bits_per_weight"]} if row else {"weight_bytes": None, "why": why})
    fmt = weight_format(scheme, model)
    if fmt is None:
        return {"weight_bytes": None, "why": f"WEIGHT_FORMATS has no format for {scheme} on {model}"}
    cfg, row = architectures()[model], next(r for r in weights_alone((model,), GPU, CONTEXT) if r["format"] == fmt)
    heads = cfg["num_attention_heads"]
    kv_dtype = 1 if str(VLLM_SWITCHES.get(scheme, {}).get("kv_cache_dtype", "")).startswith("fp8") else 2
    per_token = kv_bytes_per_token(cfg["num_hidden_layers"], cfg.get("num_key_value_heads", heads),
                                   cfg.get("head_dim") or cfg["hidden_size"] // heads, kv_dtype)
    weights = predicted_bytes(cfg, fmt)
    left = BUDGET * GPU_PEAKS[GPU].memory_gb * 1e9 - RESERVE_BYTES - weights
    tokens = max(0, int(left // per_token))
    out = {"weight_bytes": weights, "vs_bf16": row["vs_bf16"], "format": fmt, "kv_bytes_per_token": per_token,
           "kv_tokens": tokens, "tokens_per_sequence": tokens // batch, "fits_context": tokens >= CONTEXT,
           "where": f"{row['provenance']}; KV: {BUDGET:.0%} of one {GPU} less {RESERVE_BYTES / 2**30:.2f} GiB reserve"}
    vllm = next((r for r in speed if r["scheme"] == scheme and r["batch"] == batch), None)
    if model == SPEED_MODEL and vllm and vllm.get("weight_gib"):
        out["vllm"] = {"weight_gib": vllm["weight_gib"], "kv_tokens": vllm.get("kv_tokens"), "where": speed_where}
    return out


def _speed(scheme: str, batch: int, rows: list[dict[str, Any]], where: str) -> dict[str, Any]:
    here = next((r for r in rows if r["scheme"] == scheme and r["batch"] == batch), None)
    base = next((r for r in rows if r["scheme"] == "bf16" and r["batch"] == batch), None)
    if not here:
        held = ", ".join(dict.fromkeys(r["scheme"] for r in rows if r["batch"] == batch))
        why = where if not rows else f"no speed run of {scheme} at batch {batch} (there: {held}; {where})"
        return {"decode_tok_s": None, "why": why}
    return {"decode_tok_s": here["decode_tok_s"], "of_roofline": here.get("of_roofline"),
            "vs_bf16": here["decode_tok_s"] / base["decode_tok_s"] if base and base.get("decode_tok_s") else None,
            "model": here.get("model"), "where": here.get("provenance") or where}


def _quality(scheme: str, rows: Sequence[dict[str, Any]] | None, pct: float) -> dict[str, Any]:
    row = next((r for r in rows or [] if r["scheme"] == scheme), None)
    if row is None:
        why = (NO_QUALITY if rows is None else "a vLLM switch on the bf16 weights: no checkpoint to score on this CPU"
               if scheme in VLLM_SWITCHES else "not quantized in this run (add it to SCHEMES, re-run step 4)")
        return {"ppl_change_pct": None, "why": why}
    ref = next(r for r in rows if r["scheme"] == "bf16")
    gate = None if scheme == "bf16" else quality_gate(row["ppl"], ref["ppl"], pct)
    return {"ppl": row["ppl"], "ppl_change_pct": 0.0 if gate is None else gate.increase_pct,
            "gate": None if gate is None else gate.sentence, "passed": None if gate is None else gate.passed,
            "agreement": row["agreement"], "mean_first_divergence": row["mean_first_divergence"],
            "identical": row.get("identical"), "where": f"{CPU_WHERE}: {row.get('eval', '')}"}


def scheme_view(scheme: str = "gptq-w4a16", batch: int | None = None, model: str = SPEED_MODEL,
                quality: Sequence[dict[str, Any]] | None = None, stored: Sequence[dict[str, Any]] | None = None,
                speed: Shown | Sequence[dict[str, Any]] | None = None,
                max_increase_pct: float = 1.0) -> dict[str, Any]:
    """Everything the explorer draws and writes for one setting of its controls, as plain data.

    `memory`, `speed`, `quality`: the chosen scheme's numbers, each with `where` it was measured, or `why` it has
    none; `all`: the same three for every scheme (the figure's bars); `captions`: one line per panel; `text`: the card.
    """
    batches = batches_of(speed)
    batch = batches[0] if batch is None else batch
    validate.choice(OWNER, "scheme", scheme, SCHEMES, f"pick one of {list(SCHEMES)} (bf16 and the lab's schemes).")
    validate.choice(OWNER, "batch", batch, batches, f"pick a batch the speed runs hold: {batches}.")
    validate.choice(OWNER, "model", model, MODELS, f"pick one of {list(MODELS)}: the lab's model or a real shape.")
    validate.number(OWNER, "max_increase_pct", max_increase_pct, "pass your gate in percent, e.g. 1.0.", 0.0)
    rows, where = _speed_rows(speed)
    every = {s: {"memory": _memory(s, model, batch, stored, rows, where), "speed": _speed(s, batch, rows, where),
                 "quality": _quality(s, quality, max_increase_pct)} for s in SCHEMES}
    view = {"settings": {"scheme": scheme, "batch": batch, "model": model}, "max_increase_pct": max_increase_pct,
            "batches": batches, **every[scheme], "all": every, "speed_where": where,
            "memory_where": next((v["memory"]["where"] for v in every.values() if "where" in v["memory"]),
                                 NO_STORAGE if model == "embedded" else "arithmetic")}
    view["captions"] = _captions(view)
    view["text"] = _text(view)
    return view


def _captions(view: dict[str, Any]) -> list[str]:
    s = view["settings"]
    lines = [f"Memory: {s['model']}, {view['memory_where']}."]
    lines.append(f"Speed: {view['speed_where']}" + ("" if any(v["speed"]["decode_tok_s"] for v in view["all"].values())
                                                    else ": nothing drawn."))
    shape = "" if s["model"] == "embedded" else (f" {s['model']} has no trained weights here (the speed runs use "
                                                  "synthetic ones), so its quality is not measured: these bars are "
                                                  "the embedded model's.")
    lines.append(f"Quality: {CPU_WHERE}, against bf16.{shape}" if any(
        v["quality"]["ppl_change_pct"] is not None for v in view["all"].values()) else f"Quality: {NO_QUALITY}.")
    return lines


def _text(view: dict[str, Any]) -> str:
    s, m, sp, q = view["settings"], view["memory"], view["speed"], view["quality"]
    memory = speed = quality = ""
    if m["weight_bytes"] is not None:
        memory = f"<b>{m['weight_bytes'] / 1e9:.4g} GB of weights</b> (x{m['vs_bf16']:.2f} of bf16's)" + (
            "" if "kv_tokens" not in m else f"; the weights and the reserve leave no KV room on one {GPU}"
            if not m["kv_tokens"] else f"; {m['kv_tokens']:,} KV tokens left on one {GPU} "
            f"({m['kv_bytes_per_token'] / 1024:.0f} KiB each): at batch {s['batch']}, {m['tokens_per_sequence']:,} "
            "tokens per sequence") + (
            f"; vLLM held {m['vllm']['weight_gib']:.2f} GiB, {m['vllm']['kv_tokens'] or 0:,} KV tokens "
            f"[{m['vllm']['where']}]" if "vllm" in m else "") + f" [{m['where']}]"
    if sp["decode_tok_s"] is not None:
        speed = (f"<b>{sp['decode_tok_s']:,.0f} decode tok/s</b> at batch {s['batch']}" +
                 ("" if sp["vs_bf16"] is None else f", x{sp['vs_bf16']:.2f} of bf16's") +
                 ("" if not sp["of_roofline"] else f", {sp['of_roofline']:.0%} of its roofline") + f" [{sp['where']}]")
    if q["ppl_change_pct"] is not None:
        quality = (f"<b>perplexity {q['ppl_change_pct']:+.2f}%</b> of bf16's ({q['gate'] or 'the reference'}), "
                   f"{q['agreement']:.0%} of greedy tokens as bf16's [{q['where']}]" + (
                       "" if s["model"] == "embedded" else
                       f" (the embedded model's: {s['model']} has no trained weights here, so no quality of its own)"))
    cells = (("memory", memory or f"none: {m.get('why')}"), ("speed", speed or f"none: {sp.get('why')}"),
             ("quality", quality or f"none: {q.get('why')}"))
    return "<table>" + "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in cells) + "</table>"


def scheme_figure(view: dict[str, Any]) -> go.Figure:
    """`scheme_view` drawn: weights, decode tok/s at the batch and perplexity change per scheme, the chosen one bold."""
    s, every = view["settings"], view["all"]
    speed_short = "not recorded yet" if "not recorded yet" in view["speed_where"] else view["speed_where"]
    memory_short = "live on this CPU" if s["model"] == "embedded" else f"arithmetic, {BUDGET:.0%} of one {GPU}"
    titles = (f"weights, {s['model']} (GB)", memory_short), (f"decode tok/s at batch {s['batch']}", speed_short), \
        ("perplexity vs bf16", "live on this CPU, embedded model")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09,
                        subplot_titles=[f"{t}<br><sup>[{w[:48]}]</sup>" for t, w in titles])
    fig.update_annotations(font_size=13)
    panels = (("weights (GB)", "memory", lambda v: v["weight_bytes"] / 1e9, "%{y:.4g} GB", view["memory_where"]),
              ("decode tok/s", "speed", lambda v: v["decode_tok_s"], "%{y:,.0f} tok/s", view["speed_where"]),
              ("perplexity change (%)", "quality", lambda v: v["ppl_change_pct"], "%{y:+.2f}%", CPU_WHERE))
    for col, (name, part, value, fmt, where) in enumerate(panels, start=1):
        have = [k for k in SCHEMES if every[k][part].get("where")]
        if not have:
            axis = col if col > 1 else ""
            fig.add_annotation(text="nothing to draw:<br>the line under the figure says why", xref=f"x{axis} domain",
                               yref=f"y{axis} domain", x=0.5, y=0.5, showarrow=False, font={"color": "gray"})
            continue
        fig.add_bar(x=have, y=[value(every[k][part]) for k in have], name=name, showlegend=False, row=1, col=col,
                    marker={"color": [scheme_colour(k) for k in have],
                            "opacity": [1.0 if k == s["scheme"] else 0.3 for k in have],
                            "line": {"color": "#000000", "width": [2 if k == s["scheme"] else 0 for k in have]}},
                    hovertemplate=f"%{{x}}: {fmt} ({where})<extra></extra>")
    fig.add_hline(y=view["max_increase_pct"], line_dash="dash", line_color="#d62728", row=1, col=3,
                  annotation_text=f"your gate +{view['max_increase_pct']:g}%", annotation_position="top left")
    for col, title in ((1, "weight bytes (GB)"), (2, "decode throughput (tok/s)"), (3, "perplexity change (%)")):
        fig.update_yaxes(title_text=title, row=1, col=col)
    fig.update_xaxes(title_text="scheme")
    where = f"memory: {view['memory_where']}; speed: {view['speed_where']}; quality: {CPU_WHERE}"
    fig = finish(fig, f"{s['scheme']} among the schemes", where, height=480)
    # the subplot titles (two lines) sit above the plots: the figure grows by them, so the plots keep their height
    fig.update_layout(margin={"t": fig.layout.margin.t + 40}, height=fig.layout.height + 40)
    return fig


class QuantizationExplorer(Explorer):
    """A scheme, a batch size and a model shape in; memory, speed and quality out, each labelled with its source."""

    def __init__(self, scheme: str = "gptq-w4a16", batch: int | None = None, model: str = SPEED_MODEL,
                 quality: Sequence[dict[str, Any]] | None = None, stored: Sequence[dict[str, Any]] | None = None,
                 speed: Shown | Sequence[dict[str, Any]] | None = None, max_increase_pct: float = 1.0):
        self.quality, self.stored, self.speed, self.max_increase_pct = quality, stored, speed, max_increase_pct
        self.view = scheme_view(scheme, batch, model, quality, stored, speed, max_increase_pct)  # refuses first
        self.scheme = widgets.Dropdown(options=SCHEMES, value=scheme, description="scheme")
        self.batch = widgets.SelectionSlider(options=self.view["batches"], value=self.view["settings"]["batch"],
                                             description="batch size", continuous_update=False)
        self.model = widgets.Dropdown(options=MODELS, value=model, description="memory of")
        self.text, self.caption = widgets.HTML(), widgets.HTML()
        self.area = FigureArea(height="480px")
        for w in (self.scheme, self.batch, self.model):
            w.observe(self.value_changed, names="value")
        self.widget = widgets.VBox([widgets.HBox([self.scheme, self.batch, self.model]), self.text, self.area.output,
                                    self.caption])
        self.show(self.view)

    @classmethod
    def from_lab(cls, quality: Sequence[dict[str, Any]] | None = None, stored: Sequence[dict[str, Any]] | None = None,
                 speed: Shown | Sequence[dict[str, Any]] | None = None, max_increase_pct: float = 1.0,
                 **controls: Any) -> QuantizationExplorer:
        """Start at the first scheme this run quantized, from the lab's step results (quality_table, storage_rows,
        speed). `speed` defaults to the recording (`speed(force=False)`: no engine starts), or "not recorded yet"."""
        if speed is None:
            speed = speed_step(force=False)
        first = next((r["scheme"] for r in quality or [] if r["scheme"] != "bf16"), None)
        controls = {"scheme": first, **controls} if first else controls
        return cls(**controls, quality=quality, stored=stored, speed=speed, max_increase_pct=max_increase_pct)

    @property
    def figure(self) -> go.Figure:
        """The figure the explorer shows now (a plain plotly Figure, redrawn whole on every change)."""
        return self.area.figure

    def settings(self) -> dict[str, Any]:
        """The controls' values, as `scheme_view` takes them."""
        return {"scheme": self.scheme.value, "batch": self.batch.value, "model": self.model.value}

    def compute(self, settings: dict[str, Any]) -> dict[str, Any]:
        return scheme_view(**settings, quality=self.quality, stored=self.stored, speed=self.speed,
                           max_increase_pct=self.max_increase_pct)

    def draw(self, view: dict[str, Any]) -> go.Figure:
        return scheme_figure(view)
