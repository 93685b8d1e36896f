"""Lab 03's panels: the KV-cache calculator, and the GPU's memory while engines start and close.

- `KVCalculator` shows the KV-cache size arithmetic live: bytes per token and the total
  for a batch of sequences, with presets of real architectures.
- `VRAMChart` draws the GPU's memory in use (NVML) while engines start, run and close,
  with a mark where each one closed: the picture of "back to baseline" during a sweep.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from ..hardware.device import nvml_memory
from ..mechanisms import kv
from .batching import _figure

GIB = 2**30


class KVCalculator:
    """Live KV-cache size: 2 (K, V) x layers x KV heads x head dim x bytes, per token, then x context x batch."""

    def __init__(self, preset: str = "Llama-3.1-8B", dtype: str = "bfloat16", context: int = 8192, batch: int = 8):
        if preset not in ARCHITECTURES:
            raise ValueError(f"KVCalculator: preset={preset!r}; allowed {', '.join(map(repr, ARCHITECTURES))}.")
        layers, heads, dim = ARCHITECTURES[preset]
        self.preset = widgets.Dropdown(options=[*ARCHITECTURES, "custom"], value=preset, description="model")
        self.layers = widgets.IntSlider(value=layers, min=1, max=128, description="layers")
        self.kv_heads = widgets.IntSlider(value=heads, min=1, max=64, description="KV heads")
        self.head_dim = widgets.Dropdown(options=[32, 64, 80, 96, 128, 192, 256], value=dim, description="head dim")
        self.dtype = widgets.Dropdown(options=list(kv.DTYPE_BYTES), value=dtype, description="KV dtype")
        self.context = widgets.IntSlider(value=context, min=128, max=131072, step=128, description="context")
        self.batch = widgets.IntSlider(value=batch, min=1, max=256, description="batch")
        self.text = widgets.HTML()
        self.bytes_per_token = self.total_bytes = 0
        self._applying = False
        self.preset.observe(self.preset_changed, names="value")
        for w in (self.layers, self.kv_heads, self.head_dim, self.dtype, self.context, self.batch):
            w.observe(self.value_changed, names="value")
        self.widget = widgets.VBox([self.preset, widgets.HBox([self.layers, self.kv_heads, self.head_dim]),
                                    widgets.HBox([self.dtype, self.context, self.batch]), self.text])
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
        """Recompute from the controls (lablib.mechanisms.kv) and rewrite the text."""
        arch = (self.layers.value, self.kv_heads.value, self.head_dim.value)
        if not self._applying and self.preset.value != "custom" and ARCHITECTURES[self.preset.value] != arch:
            self.preset.value = "custom"
        if self._applying:
            return
        self.bytes_per_token = kv.kv_bytes_per_token(*arch, self.dtype.value)
        self.total_bytes = kv.kv_cache_bytes(*arch, self.dtype.value, self.context.value, self.batch.value)
        self.text.value = (
            f"<b>{self.bytes_per_token:,} bytes per token</b> ({self.bytes_per_token / 1024:.1f} KiB) = 2 (K and V) "
            f"&times; {arch[0]} layers &times; {arch[1]} KV heads &times; {arch[2]} head dim &times; "
            f"{kv.bytes_per_element(self.dtype.value)} bytes ({self.dtype.value})<br>"
            f"<b>{self.total_bytes / GIB:.2f} GiB</b> of KV cache for {self.batch.value} sequences &times; "
            f"{self.context.value:,} tokens")

    def display(self) -> widgets.VBox:
        """The calculator; as the last line of a cell it shows itself."""
        return self.widget

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


class VRAMChart:
    """GPU memory in use over time, sampled from NVML in a background thread and drawn as it comes.

    `with chart: <start and close engines>`; `chart.mark(text)` puts a labelled marker at
    the current time (e.g. when an engine closed). NVML needs no CUDA context, so watching
    costs the notebook no GPU memory. Without a GPU (no NVML) it records nothing and says so.
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
        self.figure, self.widget, self._live = _figure()
        self.figure.add_trace(go.Scatter(x=[], y=[], mode="lines", name="used (GiB)"))
        self.figure.update_layout(title=title, xaxis_title="seconds", yaxis_title="GiB", showlegend=True)

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
            if self._live:
                self.figure.data[0].x, self.figure.data[0].y = tuple(self.t), tuple(self.used_gib)
        return True

    def mark(self, text: str) -> None:
        """A labelled vertical marker at the current time."""
        x = time.perf_counter() - self._t0
        self.marks.append((x, text))
        if self._live:
            self.figure.add_vline(x=x, line_dash="dot", annotation_text=text)

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

    def __enter__(self) -> VRAMChart:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def static_figure(self) -> go.Figure:
        """The whole timeline with its marks, as a plain figure (for a report, or without anywidget)."""
        fig = go.Figure(go.Scatter(x=self.t, y=self.used_gib, mode="lines", name="used (GiB)"))
        for x, text in self.marks:
            fig.add_vline(x=x, line_dash="dot", annotation_text=text)
        fig.update_layout(title=self.title, xaxis_title="seconds", yaxis_title="GiB", showlegend=True)
        return fig

    def display(self) -> Any:
        """The live chart when vLLM runs on this machine; otherwise one line saying why it stays empty."""
        from ..session import mode

        m = mode()
        if not m["live"]:
            return f"VRAM chart not live ({m['why']}): the recorded VRAM before and after each engine is in the table below"
        return self.widget


ARCHITECTURES: dict[str, tuple[int, int, int]] = {  # name: (layers, KV heads, head dim), from config.json
    "Llama-3.1-8B": (32, 8, 128),
    "Llama-3.2-1B": (16, 8, 64),
    "Qwen2.5-7B": (28, 4, 128),
    "embedded target": (5, 2, 64),
}
