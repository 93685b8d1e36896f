"""Lab 03's panels: the KV-cache calculator, and the GPU's memory while engines start and close.

- `KVCalculator` shows the KV-cache size arithmetic live: bytes per token and the total for a
  batch of sequences, for every architecture the project ships (each real shape in
  `data/synthetic/architectures.json`, read at import, and the two embedded models) or a custom one, and the answer
  against the memory of the GPUs people run on (T4 16 GB to H200 141 GB): the KV cache's share of
  each, and whether bf16 weights + that KV cache + the fit estimator's overheads fit vLLM's default
  budget (90% of the GPU), the same arithmetic as `lablib.hardware.fit`.
- `VRAMChart` draws the GPU's memory in use (NVML) while engines start, run and close,
  with a mark where each one closed: the picture of "back to baseline" during a sweep. Like
  lab 01's panel it redraws a static figure into an Output (`widgets.figure`), so it survives a
  browser refresh.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from ..hardware.device import nvml_memory
from ..hardware.fit import ACTIVATION_OVERHEAD, CONTEXT_OVERHEAD, GRAPH_OVERHEAD
from ..mechanisms import kv
from ..mechanisms.gpus import GPU_PEAKS
from ..models import architectures, embedded_path, parameter_count, shape
from ..plots.style import finish
from ..session import live_label, mode
from .figure import FigureArea

_CELL = "padding:0 0.8em;"  # table cells: the 'needs' figures ran into the fit column

GIB = 2**30
DEFAULT_BUDGET = 0.9  # vLLM's default gpu_memory_utilization
OVERHEAD = CONTEXT_OVERHEAD + ACTIVATION_OVERHEAD + GRAPH_OVERHEAD
# (what the table calls it, its GPU_PEAKS entry): the GPUs of a free Colab, a cloud L4, the A100s and the Hoppers
GPUS: list[tuple[str, str]] = [("T4 16 GB", "T4"), ("L4 24 GB", "L4"), ("A100 40 GB", "A100 40GB"),
                               ("A100 80 GB", "A100 80GB SXM"), ("H100 80 GB", "H100 SXM"), ("H200 141 GB", "H200")]


def _display_name(key: str, cfg: dict[str, Any]) -> str:
    """"Llama-3.1-8B" from the config's source ("meta-llama/Llama-3.1-8B config.json"), else the key."""
    source = str(cfg.get("_source") or "")
    return source.split("/")[-1].split(" ")[0] if "/" in source else key


def _shipped() -> tuple[dict[str, tuple[int, int, int]], dict[str, int], dict[str, str]]:
    """Every shipped architecture: (layers, KV heads, head dim), parameter counts, and lower-case aliases."""
    shapes: dict[str, tuple[int, int, int]] = {}
    params: dict[str, int] = {}
    aliases: dict[str, str] = {}
    configs = {_display_name(k, c): (k, c) for k, c in architectures().items()}
    for which in ("target", "draft"):
        path = embedded_path(which) / "config.json"
        if path.exists():
            configs[f"embedded {which}"] = (f"embedded-{which}", json.loads(path.read_text()))
    for name, (key, cfg) in configs.items():
        sh = shape(cfg)
        shapes[name] = (sh["layers"], sh["kv_heads"], sh["head_dim"])
        params[name] = parameter_count(cfg)
        aliases[key.lower()] = aliases[name.lower()] = name
    aliases["embedded"] = "embedded target"
    return shapes, params, aliases


ARCHITECTURES, PARAMETERS, _ALIASES = _shipped()  # name: (layers, KV heads, head dim), from config.json


def gpu_rows(kv_bytes: int, weight_bytes: int | None) -> list[dict[str, Any]]:
    """The answer against each GPU in GPUS: the KV cache's share of its memory, and whether weights + KV fit.

    Capacity is the datasheet's GB taken as GiB (as lab 00's fit table does); the fit allows the
    overheads `lablib.hardware.fit` allows and vLLM's default budget of 90%. Without the weights (a custom
    shape) the fit is of the KV cache and overheads alone."""
    rows = []
    for label, key in GPUS:
        memory = GPU_PEAKS[key].memory_gb * GIB
        need = kv_bytes + OVERHEAD + (weight_bytes or 0)
        rows.append({"gpu": label, "memory_GiB": memory / GIB, "kv_share": kv_bytes / memory,
                     "need_GiB": need / GIB, "fits": need <= DEFAULT_BUDGET * memory})
    return rows


class KVCalculator:
    """Live KV-cache size: 2 (K, V) x layers x KV heads x head dim x bytes, per token, then x context x batch."""

    def __init__(self, preset: str = "Llama-3.1-8B", dtype: str = "bfloat16", context: int = 8192, batch: int = 8):
        name = _ALIASES.get(str(preset).lower())
        if name is None:
            raise ValueError(f"KVCalculator: preset={preset!r}; allowed {', '.join(map(repr, ARCHITECTURES))} "
                             "(or their lower-case keys, e.g. 'llama-3.1-8b').")
        layers, heads, dim = ARCHITECTURES[name]
        self.preset = widgets.Dropdown(options=[*ARCHITECTURES, "custom"], value=name, description="model")
        self.layers = widgets.IntSlider(value=layers, min=1, max=128, description="layers")
        self.kv_heads = widgets.IntSlider(value=heads, min=1, max=64, description="KV heads")
        dims = sorted({32, 64, 80, 96, 128, 192, 256} | {d for _, _, d in ARCHITECTURES.values()})
        self.head_dim = widgets.Dropdown(options=dims, value=dim, description="head dim")
        self.dtype = widgets.Dropdown(options=list(kv.DTYPE_BYTES), value=dtype, description="KV dtype")
        self.context = widgets.IntSlider(value=context, min=128, max=131072, step=128, description="context")
        self.batch = widgets.IntSlider(value=batch, min=1, max=256, description="batch")
        self.text = widgets.HTML()
        self.gpu_table = widgets.HTML()
        self.bytes_per_token = self.total_bytes = 0
        self.weight_bytes: int | None = None
        self.gpus: list[dict[str, Any]] = []
        self._applying = False
        self.preset.observe(self.preset_changed, names="value")
        for w in (self.layers, self.kv_heads, self.head_dim, self.dtype, self.context, self.batch):
            w.observe(self.value_changed, names="value")
        self.widget = widgets.VBox([self.preset, widgets.HBox([self.layers, self.kv_heads, self.head_dim]),
                                    widgets.HBox([self.dtype, self.context, self.batch]), self.text, self.gpu_table])
        self.refresh()

    def preset_changed(self, change: dict) -> None:
        self.apply_preset(change["new"])

    def value_changed(self, change: dict) -> None:
        self.refresh()

    def apply_preset(self, name: str) -> None:
        """Set layers, KV heads and head dim from a named architecture ("custom" leaves them)."""
        if name in ARCHITECTURES:
            self._applying = True
            try:
                self.layers.value, self.kv_heads.value, self.head_dim.value = ARCHITECTURES[name]
            finally:
                self._applying = False
        self.refresh()

    def refresh(self) -> None:
        """Recompute from the controls (lablib.mechanisms.kv) and rewrite the text and the GPU table."""
        arch = (self.layers.value, self.kv_heads.value, self.head_dim.value)
        if not self._applying and self.preset.value != "custom" and ARCHITECTURES[self.preset.value] != arch:
            self.preset.value = "custom"
        if self._applying:
            return
        self.bytes_per_token = kv.kv_bytes_per_token(*arch, self.dtype.value)
        self.total_bytes = kv.kv_cache_bytes(*arch, self.dtype.value, self.context.value, self.batch.value)
        params = PARAMETERS.get(self.preset.value)
        self.weight_bytes = None if params is None else 2 * params
        self.text.value = (
            f"<b>{self.bytes_per_token:,} bytes per token</b> ({self.bytes_per_token / 1024:.1f} KiB) = 2 (K and V) "
            f"&times; {arch[0]} layers &times; {arch[1]} KV heads &times; {arch[2]} head dim &times; "
            f"{kv.bytes_per_element(self.dtype.value)} bytes ({self.dtype.value})<br>"
            f"<b>{self.total_bytes / GIB:.2f} GiB</b> of KV cache for {self.batch.value} sequences &times; "
            f"{self.context.value:,} tokens")
        self.gpus = gpu_rows(self.total_bytes, self.weight_bytes)
        self.gpu_table.value = self._table()

    def _table(self) -> str:
        weights = (f"bf16 weights {self.weight_bytes / GIB:.2f} GiB + " if self.weight_bytes is not None
                   else "a custom shape, weights unknown: ")
        head = (f"<p style='margin:4px 0'>On common GPUs: {weights}KV {self.total_bytes / GIB:.2f} GiB + "
                f"{OVERHEAD / GIB:.2f} GiB overhead, against vLLM's default budget "
                f"(gpu_memory_utilization={DEFAULT_BUDGET})</p>")
        cells = "".join(
            f"<tr><td style='{_CELL}'>{r['gpu']}</td><td style='text-align:right;{_CELL}'>{r['kv_share']:.0%}</td>"
            f"<td style='text-align:right;{_CELL}'>{r['need_GiB']:.1f} GiB</td>"
            f"<td style='{_CELL}color:{'#2a7' if r['fits'] else '#c00'}'>{'fits' if r['fits'] else 'does not fit'}</td></tr>"
            for r in self.gpus)
        return (head + "<table style='border-collapse:collapse'><tr><th style='text-align:left'>GPU</th>"
                f"<th style='{_CELL}'>KV cache / memory</th><th style='{_CELL}'>needs</th>"
                f"<th style='text-align:left;{_CELL}'>at 90%</th></tr>"
                + cells + "</table>")

    def display(self) -> widgets.VBox:
        """The calculator; as the last line of a cell it shows itself."""
        return self.widget

    def _ipython_display_(self) -> None:
        from IPython.display import display  # deferred: IPython

        display(self.widget)


class VRAMChart:
    """GPU memory in use over time, sampled from NVML in a background thread and drawn as it comes.

    `with chart: <start and close engines>`; `chart.mark(text)` puts a labelled marker at
    the current time (e.g. when an engine closed). NVML needs no CUDA context, so watching
    costs the notebook no GPU memory. Without a GPU (no NVML) it records nothing and says so.
    The figure is redrawn whole into an Output at most once a second, and at every mark and stop.
    """

    def __init__(self, interval_s: float = 0.5, device_index: int = 0, title: str = "GPU memory in use (NVML)"):
        if not (isinstance(interval_s, (int, float)) and interval_s > 0):
            raise ValueError(f"VRAMChart.interval_s={interval_s!r}: allowed a number of seconds > 0, e.g. 0.5.")
        self.interval_s, self.device_index, self.title = float(interval_s), device_index, title
        self.t: list[float] = []
        self.used_gib: list[float] = []
        self.marks: list[tuple[float, str]] = []
        self.total_gib: float | None = None
        self.note: str | None = None  # why nothing is drawn, when NVML is missing
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.area = FigureArea(self.static_figure(), min_interval_s=1.0)
        self.widget = self.area.output

    @property
    def figure(self) -> go.Figure:
        """What the chart shows now (a plain figure, redrawn whole on each change)."""
        return self.area.figure

    @property
    def available(self) -> bool:
        return nvml_memory(self.device_index) is not None

    def sample(self) -> bool:
        """Take one sample now; False without NVML."""
        mem = nvml_memory(self.device_index)
        if mem is None:
            return False
        with self._lock:
            self.t.append(time.perf_counter() - self._t0)
            self.used_gib.append(mem[0] / 2**30)
            self.total_gib = mem[2] / 2**30
        if self.area.due():
            self.area.show(self.static_figure(), force=False)
        return True

    def mark(self, text: str) -> None:
        """A labelled vertical marker at the current time."""
        with self._lock:
            self.marks.append((time.perf_counter() - self._t0, text))
        self.area.show(self.static_figure())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> VRAMChart:
        if not self.sample():
            self.note = "no NVIDIA GPU visible (NVML): nothing to draw"
            return self
        self.note = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="vram-chart", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            self.sample()
            self.area.show(self.static_figure())

    def __enter__(self) -> VRAMChart:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def static_figure(self) -> go.Figure:
        """The whole timeline with its marks, as a plain figure (what the chart shows; for a report too)."""
        with self._lock:
            t, used, marks, total = list(self.t), list(self.used_gib), list(self.marks), self.total_gib
        fig = go.Figure(go.Scatter(x=t, y=used, mode="lines", name="used", line={"color": "#1f77b4"},
                                   hovertemplate="%{x:.1f} s: %{y:.2f} GiB<extra></extra>"))
        for x, text in marks:
            fig.add_vline(x=x, line_dash="dot", annotation_text=text, annotation_textangle=-90)
        fig.update_xaxes(title_text="time since the chart started (s)")
        fig.update_yaxes(title_text="GPU memory used (GiB)", rangemode="tozero",
                         range=[0, total * 1.02] if total else None)
        return finish(fig, self.title, live_label())

    def display(self) -> Any:
        """The live chart when vLLM runs on this machine; otherwise one line saying why it stays empty."""
        m = mode()
        if not m["live"]:
            return f"VRAM chart not live ({m['why']}): the recorded VRAM before and after each engine is in the table below"
        return self.widget
